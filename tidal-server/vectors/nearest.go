package vectors

// Nearest returns the k stored vectors most similar to q by cosine
// similarity, best first; equal scores are ordered by entity, ascending, so
// the answer does not depend on insertion order. Fewer than k matches are
// returned when the store holds fewer than k vectors. q must pass Validate
// (the error is then a *FieldError); k must be positive.
//
// The search is exact: one pass over the arena keeping the k best in a
// bounded min-heap, O(n·dim + n·log k). Scores are computed in float32 with
// a fixed summation order, so a given binary on a given architecture always
// returns the same scores; they may differ in the last bits across
// architectures (e.g. where the compiler fuses multiply-adds), which is why
// scores are never part of the replicated state.
//
// It pins a QueryView and scans that, so Puts proceed during the scan,
// waiting at most for one chunk (see QueryView).
func (s *Store) Nearest(q []float32, k int) ([]Match, error) {
	unit, err := s.prepareQuery(q, k)
	if err != nil {
		return nil, err // invalid queries pin nothing
	}
	v := s.PinQuery()
	defer v.Release()
	return v.scan(unit, k), nil
}

// worse reports whether a ranks below b: a lower score, or an equal score
// and a higher entity id.
func worse(a, b Match) bool {
	if a.Score != b.Score {
		return a.Score < b.Score
	}
	return a.Entity > b.Entity
}

// topK keeps the k best matches seen so far in a min-heap whose root is the
// worst of them, so a candidate is compared against the root and most are
// discarded in O(1).
type topK struct {
	items []Match
	k     int
}

func (h *topK) offer(m Match) {
	if len(h.items) < h.k {
		h.items = append(h.items, m)
		h.up(len(h.items) - 1)
		return
	}
	if !worse(h.items[0], m) {
		return
	}
	h.items[0] = m
	h.down(0)
}

func (h *topK) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !worse(h.items[i], h.items[parent]) {
			return
		}
		h.items[i], h.items[parent] = h.items[parent], h.items[i]
		i = parent
	}
}

func (h *topK) down(i int) {
	n := len(h.items)
	for {
		least := i
		if l := 2*i + 1; l < n && worse(h.items[l], h.items[least]) {
			least = l
		}
		if r := 2*i + 2; r < n && worse(h.items[r], h.items[least]) {
			least = r
		}
		if least == i {
			return
		}
		h.items[i], h.items[least] = h.items[least], h.items[i]
		i = least
	}
}

// sorted empties the heap into a slice ordered best first.
func (h *topK) sorted() []Match {
	out := h.items
	for n := len(out) - 1; n > 0; n-- {
		// Move the current worst to the end of the unsorted prefix.
		out[0], out[n] = out[n], out[0]
		h.items = out[:n]
		h.down(0)
	}
	h.items = nil
	return out
}
