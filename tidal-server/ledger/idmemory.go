package ledger

import (
	"hash/maphash"
	"slices"
)

// generation is one generation of the id memory. Apply adds ids in log
// order, so they are held sorted by (index, position) by construction:
// audits and snapshots walk them without sorting, and the index finds an
// id's slot.
//
// Layout: nothing here holds a pointer per id, so
// the garbage collector scans a generation of 500,000 ids as a few dozen
// objects instead of 500,000 strings and a map of string keys, and an
// insert allocates nothing.
//   - records live in fixed-size chunks (growing never copies the ids
//     already held); an id's bytes are copied into its chunk's byte arena
//     and the record keeps their offset and length;
//   - the index is open addressing with linear probing over a flat array
//     of uint64 words sized for the generation's capacity up front: the
//     high 32 bits are a tag from the id's hash (most probes that miss are
//     decided without touching the record), the low 32 the record's
//     number + 1 (0 marks an empty slot). Ids are never removed: a whole
//     generation is dropped at once.
type generation struct {
	chunks []idChunk
	n      int
	index  []uint64
	mask   uint64
}

const chunkSize = 4096

type idChunk struct {
	recs  []rememberedID
	arena []byte
}

type rememberedID struct {
	off uint32 // of the id's bytes in its chunk's arena
	len uint8  // ids are at most MaxIDLen bytes
	idRecord
}

// idSeed is the process's seed for id hashes. The index is local to the
// process (never encoded), so the seed need not agree between nodes.
var idSeed = maphash.MakeSeed()

// newGeneration sizes the index for capacity ids up front (at most half
// full at capacity): a generation fills to exactly IDsPerGeneration, and
// growing the index step by step would rehash every id on the apply path.
// A generation that receives more ids than its capacity (the old
// generation is never added to; Restore adds to a fresh one) grows.
func newGeneration(capacity int) *generation {
	g := &generation{}
	g.grow(max(16, 2*capacity))
	return g
}

func (g *generation) grow(slots int) {
	size := 16
	for size < slots {
		size *= 2
	}
	old := g.index
	g.index = make([]uint64, size)
	g.mask = uint64(size - 1)
	for _, w := range old {
		if w != 0 {
			g.place(w)
		}
	}
}

// place puts an index word in the first free slot from its tag's home;
// used when growing, where the tag is all a word's hash we still have.
// Tags are the hash's high 32 bits, so a grown table probes from the same
// home as a lookup computes (see home).
func (g *generation) place(w uint64) {
	for i := home(w>>32, g.mask); ; i = (i + 1) & g.mask {
		if g.index[i] == 0 {
			g.index[i] = w
			return
		}
	}
}

// home is where probing for a hash with this tag starts. Tables are at
// most 2^32 slots here, so the tag (the hash's high 32 bits) spreads ids
// over any of them; mixing it again keeps consecutive tags apart.
func home(tag uint64, mask uint64) uint64 {
	return (tag * 0x9E3779B97F4A7C15 >> 32) & mask
}

func (g *generation) len() int { return g.n }

func (g *generation) idAt(r *rememberedID, c *idChunk) []byte {
	return c.arena[r.off : r.off+uint32(r.len)]
}

// add appends an id; the caller guarantees it is absent and that (index,
// position) is above every id already held.
func (g *generation) add(id string, rec idRecord) {
	g.addHashed(id, maphash.String(idSeed, id), rec)
}

// addHashed is add with the id's hash (maphash.String(idSeed, id))
// already computed.
func (g *generation) addHashed(id string, hash uint64, rec idRecord) {
	if g.n%chunkSize == 0 {
		g.chunks = append(g.chunks, idChunk{recs: make([]rememberedID, 0, chunkSize), arena: make([]byte, 0, chunkSize*16)})
	}
	if 2*(g.n+1) > len(g.index) {
		g.grow(2 * len(g.index))
	}
	c := &g.chunks[len(g.chunks)-1]
	c.recs = append(c.recs, rememberedID{off: uint32(len(c.arena)), len: uint8(len(id)), idRecord: rec})
	c.arena = append(c.arena, id...)
	tag := hash >> 32
	g.place(tag<<32 | uint64(g.n+1))
	g.n++
}

func (g *generation) get(id string) (idRecord, bool) {
	if g.n == 0 {
		return idRecord{}, false
	}
	return g.getHashed(id, maphash.String(idSeed, id))
}

// getHashed is get with the id's hash already computed.
func (g *generation) getHashed(id string, hash uint64) (idRecord, bool) {
	if g.n == 0 {
		return idRecord{}, false
	}
	tag := hash >> 32
	for i := home(tag, g.mask); ; i = (i + 1) & g.mask {
		w := g.index[i]
		if w == 0 {
			return idRecord{}, false
		}
		if w>>32 != tag {
			continue
		}
		n := int(uint32(w)) - 1
		c := &g.chunks[n/chunkSize]
		r := &c.recs[n%chunkSize]
		if string(g.idAt(r, c)) == id {
			return r.idRecord, true
		}
	}
}

// frozen returns the generation as it is now, for reading (len, each)
// while ids go on being added to g: its chunk headers are copied with
// their lengths, so later appends stay out of view (see Captured). The
// copy has no index; it cannot look ids up.
func (g *generation) frozen() generation {
	return generation{chunks: slices.Clone(g.chunks), n: g.n}
}

// each calls fn for every id in log order. The id's bytes are only valid
// during the call.
func (g *generation) each(fn func(id []byte, rec *idRecord)) {
	for ci := range g.chunks {
		c := &g.chunks[ci]
		for i := range c.recs {
			r := &c.recs[i]
			fn(g.idAt(r, c), &r.idRecord)
		}
	}
}
