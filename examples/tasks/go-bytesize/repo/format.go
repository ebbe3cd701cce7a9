// Package bytesize formats and parses byte counts with IEC units (KiB, MiB, ...).
package bytesize

import "fmt"

const unit = 1024

// Format renders n bytes with one decimal in the largest unit that keeps the value >= 1,
// e.g. 1536 -> "1.5 KiB"; values below 1 KiB are printed as plain bytes.
func Format(n int64) string {
	if n < 0 {
		return "-" + Format(-n)
	}
	if n <= unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
