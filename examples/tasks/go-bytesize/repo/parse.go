package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

var multipliers = map[string]float64{
	"B":   1,
	"KiB": 1 << 10,
	"MiB": 1 << 20,
	"GiB": 1 << 30,
	"TiB": 1 << 40,
}

// Parse reads "<number> <unit>" (the space is optional), e.g. "1.5 KiB" or "512B".
func Parse(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i <= 0 {
		return 0, fmt.Errorf("bytesize: %q: missing number or unit", s)
	}
	num, err := strconv.ParseFloat(s[:i], 64)
	if err != nil {
		return 0, fmt.Errorf("bytesize: %q: %v", s, err)
	}
	mult, ok := multipliers[strings.TrimSpace(s[i:])]
	if !ok {
		return 0, fmt.Errorf("bytesize: %q: unknown unit", s)
	}
	return int64(num * mult), nil
}
