package semver

import "testing"

func TestCompareNumeric(t *testing.T) {
	cases := []struct {
		name, a, b string
		want       int
	}{
		{"major", "2.0.0", "10.0.0", -1},
		{"minor", "1.10.0", "1.9.0", 1},
		{"patch", "1.0.1", "1.0.1", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Compare(c.a, c.b); got != c.want {
				t.Errorf("Compare(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
			}
		})
	}
}

func TestComparePrereleases(t *testing.T) {
	if got := Compare("1.0.0-alpha", "1.0.0-beta"); got != -1 {
		t.Errorf("alpha vs beta = %d, want -1", got)
	}
}

func TestCompareIgnoresBuild(t *testing.T) {
	if got := Compare("1.0.0+a", "1.0.0+b"); got != 0 {
		t.Errorf("got %d, want 0", got)
	}
}
