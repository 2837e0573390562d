package ingest

import (
	"testing"
	"time"

	"google.golang.org/grpc"
)

// heldStream is a grpc.ServerStream whose SendMsg blocks until released,
// as it does while the client's flow-control window is full.
type heldStream struct {
	grpc.ServerStream
	sending chan struct{}
	release chan struct{}
}

func (h *heldStream) SendMsg(any) error {
	h.sending <- struct{}{}
	<-h.release
	return nil
}

// A request's goroutine sends its own answer; a send held by flow control
// (a client slow to read its answers) must not stop the receiver from
// starting the next requests, nor let anything be sent once the stream's
// handler is returning.
func TestHeldSendDoesNotStopStartingRequests(t *testing.T) {
	h := &heldStream{sending: make(chan struct{}), release: make(chan struct{})}
	st := &streamState{ss: h}
	sent := make(chan struct{})
	go func() {
		st.send([]byte("answer"))
		close(sent)
	}()
	<-h.sending // the send is held

	started := make(chan bool, 1)
	go func() { started <- st.start() }()
	select {
	case ok := <-started:
		if !ok {
			t.Fatal("expected the stream to take requests")
		}
		st.wg.Done()
	case <-time.After(10 * time.Second):
		t.Fatal("starting a request waited for a held send")
	}

	close(h.release)
	<-sent
	st.closeSend()
	if st.start() {
		t.Fatal("expected no request started once the stream is closing")
	}
	done := make(chan struct{})
	go func() {
		st.send([]byte("late")) // would block on h.sending if it reached SendMsg
		close(done)
	}()
	select {
	case <-done:
	case <-h.sending:
		t.Fatal("an answer was sent after the stream's handler began returning")
	case <-time.After(10 * time.Second):
		t.Fatal("send after close blocked")
	}
}
