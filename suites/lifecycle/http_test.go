package lifecycle

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
)

// newHTTP is a raw client of c's nodes: over TLS (HTTP/2) with the admin
// certificate on a secured cluster.
func newHTTP(c *cluster.Cluster) *http.Client { return c.HTTPClient(10 * time.Second) }

// post sends a raw body to a node of c and returns the status and the
// error's field.
func post(c *cluster.Cluster, hc *http.Client, addr, path, contentType, body string) (int, string) {
	resp, err := hc.Post(c.URL(addr)+path, contentType, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Field string `json:"field"`
		} `json:"error"`
	}
	json.Unmarshal(data, &e)
	return resp.StatusCode, e.Error.Field
}
