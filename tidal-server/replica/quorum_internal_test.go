package replica

import "testing"

// The check says false, and true only for a majority heard within the
// window (self always counts; a voter never heard from does not).
func TestQuorumHeard(t *testing.T) {
	heard := map[uint64]uint64{2: 90, 3: 100, 4: 70}
	last := func(id uint64) (uint64, bool) { at, ok := heard[id]; return at, ok }
	for _, tc := range []struct {
		name   string
		voters []uint64
		now    uint64
		want   bool
	}{
		{"alone", []uint64{1}, 1000, true},
		{"three, both heard", []uint64{1, 2, 3}, 100, true},
		{"three, one heard at the window's edge", []uint64{1, 2, 5}, 100, true},
		{"three, one heard just past the window", []uint64{1, 2, 5}, 101, false},
		{"three, the others silent", []uint64{1, 2, 3}, 200, false},
		{"three, the others never heard", []uint64{1, 5, 6}, 0, false},
		{"four, one other heard", []uint64{1, 2, 4, 5}, 100, false},
		{"four, two others heard", []uint64{1, 2, 3, 4}, 100, true},
		{"five, two others heard", []uint64{1, 2, 3, 5, 6}, 100, true},
	} {
		if got := quorumHeard(tc.voters, 1, last, tc.now, 10); got != tc.want {
			t.Errorf("%s: quorumHeard(%v, now %d, window 10) = %v, expected %v", tc.name, tc.voters, tc.now, got, tc.want)
		}
	}
}
