package report

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRetry(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	calls := 0
	if err := retry(ctx, 3, 0, func() error { calls++; return boom }); !errors.Is(err, boom) || calls != 3 {
		t.Fatalf("always failing: expected 3 attempts and the last error, found %d and %v", calls, err)
	}
	calls = 0
	if err := retry(ctx, 3, 0, func() error {
		calls++
		if calls < 2 {
			return boom
		}
		return nil
	}); err != nil || calls != 2 {
		t.Fatalf("failing once: expected success on the 2nd attempt, found %d attempts and %v", calls, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	calls = 0
	if err := Retry(cctx, func() error { calls++; return fmt.Errorf("attempt %d", calls) }); err == nil || err.Error() != "attempt 1" || calls != 1 {
		t.Fatalf("ctx ended: expected one attempt and its error, found %d and %v", calls, err)
	}
}

func TestFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ok" {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "body")
	}))
	defer srv.Close()
	ctx := context.Background()
	var got string
	if err := Fetch(ctx, srv.Client(), srv.URL+"/ok", func(r io.Reader) error {
		b, err := io.ReadAll(r)
		got = string(b)
		return err
	}); err != nil || got != "body" {
		t.Fatalf("200: expected the body handed over, found %q and %v", got, err)
	}
	err := Fetch(ctx, srv.Client(), srv.URL+"/down", func(io.Reader) error { t.Error("called for a 503"); return nil })
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503: expected the status as the error, found %v", err)
	}
	bad := errors.New("disk full")
	if err := Fetch(ctx, srv.Client(), srv.URL+"/ok", func(io.Reader) error { return bad }); !errors.Is(err, bad) {
		t.Fatalf("fn failing: expected its error wrapped, found %v", err)
	}
}
