package server

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// publishClientAddr makes the replicated membership table carry the client
// address this node serves on. Nodes bootstrapped from --peers write
// identical bootstrap entries that know only peer addresses, so without
// this `status` would show an empty CLIENT column for them. It retries
// until the table holds the address (a learner waits for its promotion),
// logging failures on transitions only, and returns at Shutdown.
func (s *Server) publishClientAddr(ctx context.Context) {
	defer close(s.publishDone)
	addr := s.advertisedClientAddr()
	every := 5 * s.cfg.TickInterval
	if every <= 0 {
		every = 500 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.replica.Done():
			return
		case <-t.C:
		}
		st := s.replica.Status()
		self, ok := memberStatus(st, s.cfg.ID)
		if ok && self.ClientAddr == addr {
			return
		}
		// A node still applying its log may not yet have applied its own
		// earlier publication.
		if !ok || self.Role == "learner" || st.Leader == 0 || st.Applied < st.Commit {
			continue
		}
		// Applied == Commit is not enough: a restarted follower's commit
		// index lags the leader's until its first appends are acked, so
		// it could see its log as applied while the entry holding its
		// address is still to come, and publish again — a membership
		// entry appended after the cluster had converged (seen in the
		// lifecycle suite as digests at two indexes). A read barrier
		// brings the applied view up to the leader's commit first.
		pctx, cancel := context.WithTimeout(ctx, 10*every)
		_, err := s.replica.ReadIndex(pctx)
		if err == nil {
			self, ok = memberStatus(s.replica.Status(), s.cfg.ID)
			switch {
			case ok && self.ClientAddr == addr:
				cancel()
				return
			case !ok:
				cancel()
				continue
			}
			err = s.replica.PublishMember(pctx, replica.Member{ID: s.cfg.ID, PeerAddr: self.PeerAddr, ClientAddr: addr})
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && !failing:
			s.log.Warn("publishing this node's client address failed; retrying", "client_addr", addr, "err", err)
			failing = true
		case err == nil:
			s.log.Info("published this node's client address in the membership table", "client_addr", addr)
			failing = false
		}
	}
}

// advertisedClientAddr is --advertise-client-addr, else --client-addr, or
// the bound address when the port was 0 (tests).
func (s *Server) advertisedClientAddr() string {
	if s.cfg.AdvertiseClientAddr != "" {
		return s.cfg.AdvertiseClientAddr
	}
	if _, port, err := net.SplitHostPort(s.cfg.ClientAddr); err == nil && port != "0" {
		return s.cfg.ClientAddr
	}
	return s.httpLis.Addr().String()
}

func memberStatus(st replica.Status, id uint64) (replica.MemberStatus, bool) {
	for _, m := range st.Members {
		if m.ID == id {
			return m, true
		}
	}
	return replica.MemberStatus{}, false
}

// checkAdvertisedAddr accepts an empty address (none given) or a host:port
// a client can dial: a host name or a specific IP, and a port > 0. An
// unspecified address (0.0.0.0, ::) is what the flag exists to replace.
func checkAdvertisedAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--advertise-client-addr %q: expected host:port: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("--advertise-client-addr %q: expected a port in 1..65535, found %q", addr, port)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("--advertise-client-addr %q: expected an address clients can dial (a host name or a specific IP), found %q", addr, host)
	}
	return nil
}
