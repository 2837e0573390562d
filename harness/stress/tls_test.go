package stress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// With TLS the generator speaks HTTP/2 (or HTTP/1.1 when
// asked) to https:// targets given as host:port, sends the token, and
// records which protocol it used.
func TestTLSTargets(t *testing.T) {
	var mu sync.Mutex
	protos := map[int]int{}
	tokens := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drain(r)
		mu.Lock()
		protos[r.ProtoMajor]++
		tokens[r.Header.Get("Authorization")]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	trusted := srv.Client().Transport.(*http.Transport).TLSClientConfig
	addr := strings.TrimPrefix(srv.URL, "https://")
	for _, tc := range []struct {
		http1     bool
		wantProto int
		wantLabel string
	}{{false, 2, "https h2"}, {true, 1, "https http/1.1"}} {
		mu.Lock()
		clear(protos)
		clear(tokens)
		mu.Unlock()
		res, err := Run(context.Background(), Config{Targets: []string{addr}, TLS: trusted, HTTP1: tc.http1, Token: "tok-0123456789abcdef", Seed: 1},
			[]Stage{{Rate: 200, Duration: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		checkBooks(t, res)
		mu.Lock()
		if res.Stages[0].OK == 0 || protos[tc.wantProto] != int(res.Stages[0].OK) || tokens["Bearer tok-0123456789abcdef"] != int(res.Stages[0].OK) {
			t.Errorf("http1=%v: expected every op over HTTP/%d with the token, saw protocols %v, tokens %v, ok %d", tc.http1, tc.wantProto, protos, tokens, res.Stages[0].OK)
		}
		mu.Unlock()
		if res.Config.Protocol != tc.wantLabel {
			t.Errorf("http1=%v: expected protocol %q recorded, found %q", tc.http1, tc.wantLabel, res.Config.Protocol)
		}
	}
}
