package server

import (
	"strings"
	"testing"
	"time"
)

// Regression (a node in a container reported its client address
// as 0.0.0.0:port, so `status` could not reach the leader through it): a
// node publishes --advertise-client-addr, not its listener's address.
func TestAdvertisedClientAddrIsPublished(t *testing.T) {
	const advertised = "tidal-1.example:7071"
	srv, _ := startNode(t, Config{ClientAddr: "127.0.0.1:0", AdvertiseClientAddr: advertised})
	deadline := time.Now().Add(30 * time.Second)
	for {
		self, ok := memberStatus(srv.replica.Status(), 1)
		if ok && self.ClientAddr == advertised {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("member 1's client address: expected %s published, found %+v (listening on %s)", advertised, self, srv.ClientAddr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAdvertisedClientAddrMustBeDialable(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7070", "[::]:7070", ":7070", "tidal-1", "tidal-1:0", "tidal-1:http"} {
		_, err := Start(Config{ID: 1, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataDir: t.TempDir() + "/d", AdvertiseClientAddr: addr}, nil)
		if err == nil || !strings.Contains(err.Error(), "--advertise-client-addr") {
			t.Errorf("--advertise-client-addr %q: expected a refusal naming the flag, found %v", addr, err)
		}
	}
	for _, addr := range []string{"tidal-1:7070", "127.0.0.1:7071", "[fd00::1]:7070"} {
		if err := checkAdvertisedAddr(addr); err != nil {
			t.Errorf("--advertise-client-addr %q: expected it accepted, found %v", addr, err)
		}
	}
}
