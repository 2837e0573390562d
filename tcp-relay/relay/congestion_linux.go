package relay

import (
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The relay's own sockets (its listener, whose accepted sockets inherit
// the setting, and its upstream connections) use a loss-based congestion
// control without pacing — cubic, or reno where the process may not pick
// cubic (net.ipv4.tcp_allowed_congestion_control) — whatever the system
// default is. With BBR as the default (as on the machine these figures
// come from), every relayed byte crossed two paced connections in series,
// and pacing on loopback cost the relay a third more CPU per MB (hrtimer
// kicks, TCP small-queue throttling) and a third of its bulk throughput:
// 0.65 of direct with BBR against 0.83–1.09 with cubic or reno, measured
// side by side (docs/performance.md). A relay is a test device between
// hosts on a LAN or one machine, where pacing buys nothing; the client and
// the server keep their own choice for the connections they make.
var congestionChoice atomic.Pointer[string] // the control that worked; "" for none

var relayCongestion = []string{"cubic", "reno"}

// tuneSocket is a net.ListenConfig / net.Dialer Control function.
func tuneSocket(_, _ string, c syscall.RawConn) error {
	return c.Control(func(fd uintptr) { setCongestion(int(fd)) })
}

func setCongestion(fd int) {
	if p := congestionChoice.Load(); p != nil {
		if *p != "" {
			_ = unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, *p)
		}
		return
	}
	chosen := ""
	for _, cc := range relayCongestion {
		if unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc) == nil {
			chosen = cc
			break
		}
	}
	congestionChoice.Store(&chosen)
}
