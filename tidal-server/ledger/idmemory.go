package ledger

// generation is one generation of the id memory. Apply adds ids in log
// order, so they are held sorted by (index, position) by construction:
// audits and snapshots walk them without sorting, and byID finds an id's
// slot. Slots live in fixed-size chunks so that growing a generation to
// hundreds of thousands of ids never copies the ones already held.
type generation struct {
	chunks [][]rememberedID
	n      int
	byID   map[string]uint32
}

const chunkSize = 4096

type rememberedID struct {
	id string
	idRecord
}

// newGeneration sizes the id index for capacity ids up front: a generation
// fills to exactly IDsPerGeneration, and growing a map of hundreds of
// thousands of string keys step by step rehashes all of them on the apply
// path (15% of apply CPU in a 100-event-batch profile).
func newGeneration(capacity int) *generation {
	return &generation{byID: make(map[string]uint32, capacity)}
}

func (g *generation) len() int { return g.n }

// add appends an id; the caller guarantees it is absent and that (index,
// position) is above every id already held.
func (g *generation) add(id string, rec idRecord) {
	if g.n%chunkSize == 0 {
		g.chunks = append(g.chunks, make([]rememberedID, 0, chunkSize))
	}
	last := len(g.chunks) - 1
	g.chunks[last] = append(g.chunks[last], rememberedID{id: id, idRecord: rec})
	g.byID[id] = uint32(g.n)
	g.n++
}

func (g *generation) get(id string) (idRecord, bool) {
	i, ok := g.byID[id]
	if !ok {
		return idRecord{}, false
	}
	return g.chunks[i/chunkSize][i%chunkSize].idRecord, true
}

// each calls fn for every id in log order.
func (g *generation) each(fn func(*rememberedID)) {
	for _, c := range g.chunks {
		for i := range c {
			fn(&c[i])
		}
	}
}
