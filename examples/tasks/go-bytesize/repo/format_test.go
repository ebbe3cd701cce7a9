package bytesize

import "testing"

func TestFormatSmall(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1: "1 B", 1023: "1023 B"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatLarger(t *testing.T) {
	for n, want := range map[int64]string{1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatNegative(t *testing.T) {
	if got := Format(-1536); got != "-1.5 KiB" {
		t.Errorf("Format(-1536) = %q", got)
	}
}
