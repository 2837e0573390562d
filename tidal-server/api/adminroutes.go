package api

// The admin routes: membership changes, leadership transfer, snapshots
// and backups.

import (
	"context"
	"net/http"
	"strconv"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

func (h *handler) addMember(w http.ResponseWriter, r *http.Request) error {
	body, release, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	defer release()
	var m replica.Member
	err = decodeBody(body, func(d *decoder, name []byte) error {
		var b []byte
		switch string(name) {
		case "id":
			m.ID, err = d.uint64("id")
		case "peer_addr":
			b, err = d.str("peer_addr")
			m.PeerAddr = string(b)
		case "client_addr":
			b, err = d.str("client_addr")
			m.ClientAddr = string(b)
		default:
			return d.unknown(name, "id, peer_addr, client_addr")
		}
		return err
	})
	if err != nil {
		return err
	}
	if m.ID == 0 {
		return invalid("id", "required: a node id > 0 never used in this cluster")
	}
	if m.PeerAddr == "" {
		return invalid("peer_addr", "required: host:port the other nodes dial")
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	if err := h.b.AddMember(ctx, m); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, m)
}

func (h *handler) removeMember(w http.ResponseWriter, r *http.Request) error {
	s := r.PathValue("id")
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return invalid("id", "expected a node id > 0, found %q", s)
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	if err := h.b.RemoveMember(ctx, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) transferLeader(w http.ResponseWriter, r *http.Request) error {
	body, release, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	defer release()
	var to uint64
	err = decodeBody(body, func(d *decoder, name []byte) error {
		if string(name) != "to" {
			return d.unknown(name, "to")
		}
		to, err = d.uint64("to")
		return err
	})
	if err != nil {
		return err
	}
	if to == 0 {
		return invalid("to", "required: the id of the member to lead")
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	if err := h.b.TransferLeader(ctx, to); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*h.opts.WriteTimeout)
	defer cancel()
	index, term, err := h.b.Snapshot(ctx)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]uint64{"index": index, "term": term})
}

func (h *handler) backup(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/octet-stream")
	_, err := h.b.Backup(r.Context(), w)
	if err != nil {
		if sw, ok := w.(*statusWriter); ok && sw.wrote {
			h.opts.Logger.Error("backup stream failed midway", "err", err)
			panic(http.ErrAbortHandler) // never let a cut backup look whole
		}
		return err
	}
	return nil
}
