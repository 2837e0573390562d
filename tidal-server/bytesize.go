package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidaldb/tidal/tidal-server/api"
)

// byteSize is a flag holding a number of bytes, written as a plain count
// ("1073741824") or with a unit: B, KB/MB/GB/TB (powers of 1000) or
// KiB/MiB/GiB/TiB (powers of 1024), case-insensitive, a fraction allowed
// ("1.5GiB").
type byteSize struct{ n *int64 }

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	// Longest suffixes first, so "GiB" is not read as "B".
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// parseByteSize reads s as byteSize describes.
func parseByteSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("expected a size in bytes such as 8GiB, 512MiB, 2GB or 1073741824, found %q", s)
	}
	v := f * mult
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("expected a size below 4 EiB, found %q", s)
	}
	return int64(math.Round(v)), nil
}

func (b byteSize) String() string {
	if b.n == nil || *b.n == 0 {
		return "0"
	}
	return strings.ReplaceAll(api.FormatBytes(*b.n), " ", "")
}

func (b byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b.n = n
	return nil
}

func (b byteSize) Type() string { return "bytes" }
