package urlpath

import "testing"

func TestCleanBasic(t *testing.T) {
	cases := map[string]string{
		"":            ".",
		"a//b":        "a/b",
		"a/./b":       "a/b",
		"a/b/../c":    "a/c",
		"a/b/../..":   ".",
		"/a/b/../../": "/",
		"docs/":       "docs/",
	}
	for in, want := range cases {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCleanRooted(t *testing.T) {
	if got := Clean("/../a"); got != "/a" {
		t.Errorf("Clean(/../a) = %q, want /a", got)
	}
}

func TestCleanSingleParent(t *testing.T) {
	if got := Clean("../a"); got != "../a" {
		t.Errorf("Clean(../a) = %q", got)
	}
}
