package urlpath

import "strings"

// Join joins non-empty elements with slashes and cleans the result.
func Join(elem ...string) string {
	var parts []string
	for _, e := range elem {
		if e != "" {
			parts = append(parts, e)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return Clean(strings.Join(parts, "/"))
}

// Split splits a cleaned path into its directory (with trailing slash) and last element.
func Split(p string) (dir, file string) {
	i := strings.LastIndex(p, "/")
	return p[:i+1], p[i+1:]
}
