package ledger

// generation is one generation of the id memory. Apply adds ids in log
// order, so order is sorted by (index, position) by construction: audits
// and snapshots walk it without sorting, and byID finds an id's slot.
type generation struct {
	order []rememberedID
	byID  map[string]uint32
}

type rememberedID struct {
	id string
	idRecord
}

func newGeneration() *generation {
	return &generation{byID: map[string]uint32{}}
}

func (g *generation) len() int { return len(g.order) }

// add appends an id; the caller guarantees it is absent and that (index,
// position) is above every id already held.
func (g *generation) add(id string, rec idRecord) {
	g.byID[id] = uint32(len(g.order))
	g.order = append(g.order, rememberedID{id: id, idRecord: rec})
}

func (g *generation) get(id string) (idRecord, bool) {
	i, ok := g.byID[id]
	if !ok {
		return idRecord{}, false
	}
	return g.order[i].idRecord, true
}
