//go:build tidalbugs

package vectors

// Test hooks for the packages that serve queries (tidal-server/server's
// tagged tests). A normal build has none of them; this package's own
// tests set the unexported fields directly.

// SetAfterChunk installs fn to run after each chunk a QueryView pinned
// from now on scans, with the store's lock released, and fn(c) names the
// chunk just scored. It lets a test hold a scan half-way; nil removes it.
func (s *Store) SetAfterChunk(fn func(chunk int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.afterChunk = fn
}

// PinnedQueries is the number of QueryViews pinned and not yet released:
// while it is above zero, overwrites save old vectors, so a caller that
// forgets Release makes every later overwrite copy. Tests of the callers
// check it returns to zero.
func (s *Store) PinnedQueries() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.views)
}
