// Package urlpath manipulates slash-separated paths purely lexically.
package urlpath

import "strings"

// Clean collapses repeated slashes, drops "." segments and resolves ".." against the preceding
// segment. A rooted path never climbs above "/"; a relative one keeps its leading "..". A
// trailing slash is preserved.
func Clean(p string) string {
	if p == "" {
		return "."
	}
	rooted := strings.HasPrefix(p, "/")
	trailing := strings.HasSuffix(p, "/") && len(p) > 1
	var out []string
	for _, seg := range strings.Split(p, "/") {
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			} else if !rooted {
				out = append(out, "..")
			}
		default:
			out = append(out, seg)
		}
	}
	s := strings.Join(out, "/")
	if rooted {
		s = "/" + s
	}
	if s == "" {
		return "."
	}
	if trailing && s != "/" {
		s += "/"
	}
	return s
}
