package api

import (
	"encoding/binary"
	"math"
	"net/http"
	"reflect"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// le encodes a vector as an application/octet-stream body.
func le(v ...float32) string {
	b := make([]byte, 0, 4*len(v))
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return string(b)
}

// A binary vector stores exactly what the same
// vector in JSON stores, and queries the same way.
func TestBinaryVectorsMatchJSON(t *testing.T) {
	vec := []float32{1, 2.5, -3, 4}
	e := newEnv(t, Options{})
	want204(t, e.do(http.MethodPut, "/v1/entities/1/embedding", "application/json", `{"id":"j","vector":[1,2.5,-3,4]}`))
	want204(t, e.do(http.MethodPut, "/v1/entities/2/embedding?id=b", "application/octet-stream", le(vec...)))
	var got [][]float32
	e.fake.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) {
		for _, ent := range []uint64{1, 2} {
			x, _ := v.Get(ent)
			got = append(got, x)
		}
	})
	if !reflect.DeepEqual(got[0], vec) || !reflect.DeepEqual(got[1], vec) {
		t.Fatalf("stored %v (JSON) and %v (binary), want %v twice", got[0], got[1], vec)
	}
	// A retry of the binary write with the same id is acknowledged as one.
	want204(t, e.do(http.MethodPut, "/v1/entities/2/embedding?id=b", "application/octet-stream", le(vec...)))

	jsonRec := e.post("/v1/query/nearest", `{"vector":[1,0,0,0],"k":1}`)
	binRec := e.do(http.MethodPost, "/v1/query/nearest?k=1", "application/octet-stream", le(1, 0, 0, 0))
	if jsonRec.Code != 200 || binRec.Code != 200 || jsonRec.Body.String() != binRec.Body.String() {
		t.Fatalf("nearest: JSON %d %s, binary %d %s: expected the same answer", jsonRec.Code, jsonRec.Body, binRec.Code, binRec.Body)
	}
}

func TestBinaryVectorsRejectBadInput(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name, method, path, body, field string
	}{
		{"too short", http.MethodPut, "/v1/entities/1/embedding?id=a", le(1, 2, 3), "vector"},
		{"too long", http.MethodPut, "/v1/entities/1/embedding?id=a", le(1, 2, 3, 4, 5), "vector"},
		{"not whole floats", http.MethodPut, "/v1/entities/1/embedding?id=a", le(1, 2, 3, 4) + "x", "vector"},
		{"NaN", http.MethodPut, "/v1/entities/1/embedding?id=a", le(1, nan, 3, 4), "vector[1]"},
		{"zero", http.MethodPut, "/v1/entities/1/embedding?id=a", le(0, 0, 0, 0), "vector"},
		{"id missing", http.MethodPut, "/v1/entities/1/embedding", le(1, 0, 0, 0), "id"},
		{"id empty", http.MethodPut, "/v1/entities/1/embedding?id=", le(1, 0, 0, 0), "id"},
		{"nearest short", http.MethodPost, "/v1/query/nearest", le(1, 0), "vector"},
		{"nearest k bad", http.MethodPost, "/v1/query/nearest?k=x", le(1, 0, 0, 0), "k"},
		{"nearest k zero", http.MethodPost, "/v1/query/nearest?k=0", le(1, 0, 0, 0), "k"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			wantError(t, e.do(tc.method, tc.path, "application/octet-stream", tc.body), http.StatusBadRequest, CodeInvalid, tc.field)
			e.wantNothingWritten()
		})
	}
	// Binary bodies are for vectors only.
	e := newEnv(t, Options{})
	wantError(t, e.do(http.MethodPost, "/v1/signals", "application/octet-stream", le(1)), http.StatusUnsupportedMediaType, CodeMediaType, "Content-Type")
}
