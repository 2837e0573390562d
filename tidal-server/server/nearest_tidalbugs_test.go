//go:build tidalbugs

// Tests that hold a vector scan half-way or count pinned vector views
// need vectors.Store's test hooks (SetAfterChunk, PinnedQueries), which
// only a tidalbugs build has: `make unit` runs them with -tags tidalbugs.

package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// The regression: POST /v1/query/nearest ran its whole scan inside
// StateMachine.Read, so Apply (the write lock) waited for every scan in
// progress. Now the handler pins a view under the read lock and scans
// outside it: with the scan parked inside Nearest, an embedding put and a
// signal batch apply, and the parked query still answers as of its pin.
func TestApplyCompletesWhileNearestScanIsParked(t *testing.T) {
	sm := NewStateMachine(testSchema(), ledger.Options{})
	index := uint64(0)
	put := func(entity uint64, vec []float32) {
		t.Helper()
		index++
		res := sm.Apply(index, 1, encodeEmbedding(embeddingPut{ID: fmt.Sprintf("e%d", index), Entity: entity, Vector: vec}))
		if r, ok := res.(EmbeddingResult); !ok || r.Err != nil {
			t.Errorf("put %d: %+v", entity, res)
		}
	}
	put(1, []float32{1, 0, 0, 0})
	put(2, []float32{0, 1, 0, 0})
	put(3, []float32{1, 1, 0, 0})

	parked, resume := make(chan struct{}), make(chan struct{})
	var store *vectors.Store
	sm.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) { store = v })
	store.SetAfterChunk(func(int) {
		close(parked)
		<-resume
	})
	h := api.New(smBackend{sm: sm}, api.Options{})
	rec := httptest.NewRecorder()
	served := make(chan struct{})
	go func() {
		defer close(served)
		req := httptest.NewRequest(http.MethodPost, "/v1/query/nearest", strings.NewReader(`{"vector":[1,0,0,0],"k":2}`))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
	}()
	<-parked
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		put(1, []float32{-1, 0, 0, 0}) // the best match becomes the worst
		put(4, []float32{1, 0, 0, 0})  // a new best match
		index++
		sm.Apply(index, 1, signalsCmd(event("s1", 9, 1)))
	}()
	select {
	case <-applied:
	case <-time.After(time.Minute): // a deadlock detector, not a timing bound
		close(resume)
		t.Fatal("expected Apply to complete while a nearest query's scan is parked; still blocked after a minute (the scan holds the state machine's lock)")
	}
	close(resume)
	<-served
	var got struct {
		Results []struct {
			Entity uint64 `json:"entity"`
		} `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("nearest: %d %s %v", rec.Code, rec.Body, err)
	}
	if len(got.Results) != 2 || got.Results[0].Entity != 1 || got.Results[1].Entity != 3 {
		t.Fatalf("expected the answer as of the pin (entities 1 then 3), found %s", rec.Body)
	}
	if n := store.PinnedQueries(); n != 0 {
		t.Fatalf("%d query views still pinned after the response; expected the handler to release its view", n)
	}
}
