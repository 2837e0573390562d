package vectors

import (
	"bytes"
	"testing"
)

// FuzzRestore feeds arbitrary bytes to Restore: it must never panic, a
// rejected input must leave the store as it was, and an accepted one must
// be canonical — snapshotting it again gives back exactly the input.
func FuzzRestore(f *testing.F) {
	for _, s := range []*Store{New(3), populated(21, 3, 5)} {
		var buf bytes.Buffer
		if err := s.Snapshot(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Add([]byte("tidalvec"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := populated(22, 3, 2)
		before := s.Digest()
		if err := s.Restore(bytes.NewReader(data)); err != nil {
			if s.Digest() != before {
				t.Fatalf("rejected snapshot changed the store: %v", err)
			}
			return
		}
		var again bytes.Buffer
		if err := s.Snapshot(&again); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), data[:again.Len()]) {
			t.Fatalf("accepted snapshot is not canonical:\n in %x\nout %x", data, again.Bytes())
		}
	})
}
