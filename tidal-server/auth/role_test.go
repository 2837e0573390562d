package auth

import "testing"

func TestParseRole(t *testing.T) {
	for _, r := range Roles {
		got, err := ParseRole(r.String())
		if err != nil || got != r {
			t.Errorf("ParseRole(%q) = %v, %v; expected %v", r.String(), got, err, r)
		}
	}
	for _, bad := range []string{"", "Admin", "root", "none", " reader", "writer\n"} {
		if r, err := ParseRole(bad); err == nil {
			t.Errorf("ParseRole(%q) = %v; expected an error", bad, r)
		}
	}
}

func TestRoleAllowsIsOrdered(t *testing.T) {
	cases := []struct {
		have, need Role
		ok         bool
	}{
		{Reader, Reader, true}, {Reader, Writer, false}, {Reader, Admin, false},
		{Writer, Reader, true}, {Writer, Writer, true}, {Writer, Admin, false},
		{Admin, Reader, true}, {Admin, Writer, true}, {Admin, Admin, true},
		// The zero role and out-of-range roles allow nothing, and nothing
		// is allowed by needing them.
		{0, Reader, false}, {Role(9), Reader, false}, {Admin, 0, false}, {Admin, Role(9), false},
	}
	for _, c := range cases {
		if got := c.have.Allows(c.need); got != c.ok {
			t.Errorf("%v.Allows(%v) = %v; expected %v", c.have, c.need, got, c.ok)
		}
	}
}
