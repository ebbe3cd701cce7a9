package semver

import "testing"

func TestParse(t *testing.T) {
	v, err := Parse("v1.2.3-rc.1+build.5")
	if err != nil {
		t.Fatal(err)
	}
	want := Version{Major: 1, Minor: 2, Patch: 3, Pre: "rc.1", Build: "build.5"}
	if v != want {
		t.Fatalf("Parse = %+v, want %+v", v, want)
	}
	if v.String() != "1.2.3-rc.1+build.5" {
		t.Fatalf("String = %q", v.String())
	}
}

func TestParseInvalid(t *testing.T) {
	for _, s := range []string{"", "1.2", "1.2.x", "1.-2.3"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) succeeded", s)
		}
	}
}
