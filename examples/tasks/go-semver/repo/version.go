// Package semver parses and compares semantic versions.
package semver

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a parsed semantic version. Build metadata is kept but ignored by comparisons.
type Version struct {
	Major, Minor, Patch int
	Pre                 string
	Build               string
}

// Parse reads "MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]", with an optional leading "v".
func Parse(s string) (Version, error) {
	var v Version
	rest := strings.TrimPrefix(s, "v")
	if i := strings.IndexByte(rest, '+'); i >= 0 {
		rest, v.Build = rest[:i], rest[i+1:]
	}
	if i := strings.IndexByte(rest, '-'); i >= 0 {
		rest, v.Pre = rest[:i], rest[i+1:]
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("semver: %q: want MAJOR.MINOR.PATCH", s)
	}
	nums := make([]int, 3)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return Version{}, fmt.Errorf("semver: %q: bad number %q", s, p)
		}
		nums[i] = n
	}
	v.Major, v.Minor, v.Patch = nums[0], nums[1], nums[2]
	return v, nil
}

// String formats the version back to its canonical form.
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	if v.Build != "" {
		s += "+" + v.Build
	}
	return s
}
