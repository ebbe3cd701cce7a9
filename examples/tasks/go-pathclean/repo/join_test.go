package urlpath

import "testing"

func TestJoin(t *testing.T) {
	if got := Join("api", "", "v1/", "users"); got != "api/v1/users" {
		t.Errorf("Join = %q", got)
	}
	if got := Join(); got != "" {
		t.Errorf("Join() = %q", got)
	}
}

func TestSplit(t *testing.T) {
	dir, file := Split("static/css/site.css")
	if dir != "static/css/" || file != "site.css" {
		t.Errorf("Split = %q, %q", dir, file)
	}
}
