package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"512B": 512, "1.5 KiB": 1536, "2 MiB": 2 << 20} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"", "KiB", "12 XB"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) succeeded", in)
		}
	}
}
