package lifecycle

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

func newHTTP() *http.Client { return &http.Client{Timeout: 10 * time.Second} }

// post sends a raw body and returns the status and the error's field.
func post(hc *http.Client, addr, path, contentType, body string) (int, string) {
	resp, err := hc.Post("http://"+addr+path, contentType, strings.NewReader(body))
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
