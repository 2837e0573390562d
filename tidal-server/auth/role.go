package auth

import "fmt"

// Role is what a client may do. Roles are ordered: a higher role may do
// everything a lower one may. The zero value is no role at all, so a
// forgotten field never grants access.
type Role uint8

const (
	// Reader may read data: GET data routes and nearest-neighbour queries.
	Reader Role = iota + 1
	// Writer may also write: POST /v1/signals, PUT embeddings.
	Writer
	// Admin may also change the cluster: /admin/* (members, leader
	// transfer, snapshots, backup).
	Admin
)

// Roles lists the valid roles, lowest first.
var Roles = []Role{Reader, Writer, Admin}

func (r Role) String() string {
	switch r {
	case Reader:
		return "reader"
	case Writer:
		return "writer"
	case Admin:
		return "admin"
	}
	if r == 0 {
		return "none"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// Valid reports whether r is one of Reader, Writer, Admin.
func (r Role) Valid() bool { return r >= Reader && r <= Admin }

// Allows reports whether a principal with role r may do what needs role
// need. An invalid role allows nothing.
func (r Role) Allows(need Role) bool { return r.Valid() && need.Valid() && r >= need }

// ParseRole reads a role name as written in certificates, the tokens file
// and flags: reader, writer or admin (exactly, lower case).
func ParseRole(s string) (Role, error) {
	switch s {
	case "reader":
		return Reader, nil
	case "writer":
		return Writer, nil
	case "admin":
		return Admin, nil
	}
	return 0, fmt.Errorf("expected role reader, writer or admin, found %q", s)
}
