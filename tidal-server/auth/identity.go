package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// URIScheme is the scheme of identity URI SANs. A certificate's other
// URI SANs (a SPIFFE id from a corporate PKI, say) are ignored.
const URIScheme = "tidal"

// MaxNameLen bounds a client name: it becomes part of a file name
// (client.NAME.crt) and of every log line about the client.
const MaxNameLen = 64

// Kind says what an identity names.
type Kind uint8

const (
	// KindMember is a cluster member: tidal://member/N.
	KindMember Kind = iota + 1
	// KindClient is a client of the HTTP API: tidal://client/NAME?role=ROLE.
	KindClient
)

func (k Kind) String() string {
	switch k {
	case KindMember:
		return "member"
	case KindClient:
		return "client"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Identity is who a certificate names. Exactly one of Member (KindMember)
// or Name and Role (KindClient) is set.
type Identity struct {
	Kind   Kind
	Member uint64
	Name   string
	Role   Role
}

func (id Identity) String() string {
	switch id.Kind {
	case KindMember:
		return fmt.Sprintf("member %d", id.Member)
	case KindClient:
		return fmt.Sprintf("client %s (%s)", id.Name, id.Role)
	}
	return "no identity"
}

// URI is the identity's canonical URI SAN.
func (id Identity) URI() *url.URL {
	switch id.Kind {
	case KindMember:
		return &url.URL{Scheme: URIScheme, Host: "member", Path: "/" + strconv.FormatUint(id.Member, 10)}
	case KindClient:
		return &url.URL{Scheme: URIScheme, Host: "client", Path: "/" + id.Name, RawQuery: "role=" + id.Role.String()}
	}
	return nil
}

// MemberIdentity returns the identity of member id, which must be > 0
// (raft's id 0 means "none").
func MemberIdentity(id uint64) (Identity, error) {
	if id == 0 {
		return Identity{}, errors.New("member id: expected a number > 0, found 0")
	}
	return Identity{Kind: KindMember, Member: id}, nil
}

// ClientIdentity returns the identity of client name with role.
func ClientIdentity(name string, role Role) (Identity, error) {
	if err := ValidName(name); err != nil {
		return Identity{}, err
	}
	if !role.Valid() {
		return Identity{}, fmt.Errorf("client %s: expected role reader, writer or admin, found %s", name, role)
	}
	return Identity{Kind: KindClient, Name: name, Role: role}, nil
}

// ValidName checks a client or token name: 1 to 64 characters of a-z,
// 0-9, '.', '_', '-', starting with a letter or digit. Lower case only,
// so "Alice" and "alice" cannot be two principals.
func ValidName(name string) error {
	if name == "" {
		return errors.New("name: expected 1 to 64 characters of a-z 0-9 . _ -, found an empty name")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("name: expected at most %d characters, found %d", MaxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return fmt.Errorf("name %q: expected a-z 0-9 . _ - (starting with a letter or digit), found %q at offset %d", name, c, i)
		}
	}
	return nil
}

// ParseIdentityURI reads an identity URI. Only the canonical forms are
// accepted (tidal://member/N with N > 0 in decimal without leading zeros;
// tidal://client/NAME?role=ROLE): anything else, such as a leading zero,
// an escaped character, a port, user info, a fragment or another query,
// is refused, so one identity has exactly one spelling.
func ParseIdentityURI(u *url.URL) (Identity, error) {
	if u == nil {
		return Identity{}, errors.New("identity URI: missing")
	}
	raw := u.String()
	if u.Scheme != URIScheme {
		return Identity{}, fmt.Errorf("identity URI %q: expected scheme %s, found %q", raw, URIScheme, u.Scheme)
	}
	if u.Opaque != "" || u.User != nil || u.Fragment != "" || u.RawFragment != "" || u.ForceQuery || u.OmitHost {
		return Identity{}, fmt.Errorf("identity URI %q: expected tidal://member/N or tidal://client/NAME?role=ROLE", raw)
	}
	rest, ok := strings.CutPrefix(u.Path, "/")
	if !ok || strings.Contains(rest, "/") {
		return Identity{}, fmt.Errorf("identity URI %q: expected one path segment after the kind, found path %q", raw, u.Path)
	}
	var id Identity
	var err error
	switch u.Host {
	case "member":
		if u.RawQuery != "" {
			return Identity{}, fmt.Errorf("identity URI %q: a member identity has no query, found %q", raw, u.RawQuery)
		}
		n, perr := strconv.ParseUint(rest, 10, 64)
		if perr != nil {
			return Identity{}, fmt.Errorf("identity URI %q: expected a member id (decimal number > 0), found %q", raw, rest)
		}
		id, err = MemberIdentity(n)
	case "client":
		if u.RawQuery == "" {
			return Identity{}, fmt.Errorf("identity URI %q: client has no role (expected ?role=reader, writer or admin)", raw)
		}
		roleName, ok := strings.CutPrefix(u.RawQuery, "role=")
		if !ok {
			return Identity{}, fmt.Errorf("identity URI %q: expected query role=ROLE, found %q", raw, u.RawQuery)
		}
		role, rerr := ParseRole(roleName)
		if rerr != nil {
			return Identity{}, fmt.Errorf("identity URI %q: %v", raw, rerr)
		}
		id, err = ClientIdentity(rest, role)
	default:
		return Identity{}, fmt.Errorf("identity URI %q: expected kind member or client, found %q", raw, u.Host)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("identity URI %q: %w", raw, err)
	}
	if canonical := id.URI().String(); canonical != raw {
		return Identity{}, fmt.Errorf("identity URI %q: not in canonical form %q", raw, canonical)
	}
	return id, nil
}

// IdentityFromCert reads the identity a certificate names. It must carry
// exactly one tidal:// URI SAN; none, more than one, a malformed one or a
// CA certificate are refused. The caller must have verified the
// certificate against the cluster CA: this reads names, it checks no
// signature.
func IdentityFromCert(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, errors.New("certificate: missing")
	}
	if cert.IsCA {
		return Identity{}, fmt.Errorf("certificate %s: a CA certificate names no member or client", describe(cert))
	}
	var found []*url.URL
	for _, u := range cert.URIs {
		if u != nil && strings.EqualFold(u.Scheme, URIScheme) {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %s: no identity; expected one URI SAN tidal://member/N or tidal://client/NAME?role=ROLE", describe(cert))
	case 1:
	default:
		names := make([]string, len(found))
		for i, u := range found {
			names[i] = u.String()
		}
		return Identity{}, fmt.Errorf("certificate %s: expected exactly one tidal:// URI SAN, found %d (%s)", describe(cert), len(found), strings.Join(names, ", "))
	}
	id, err := ParseIdentityURI(found[0])
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %s: %w", describe(cert), err)
	}
	return id, nil
}

// MemberFromCert returns the member id a node certificate names.
func MemberFromCert(cert *x509.Certificate) (uint64, error) {
	id, err := IdentityFromCert(cert)
	if err != nil {
		return 0, err
	}
	if id.Kind != KindMember {
		return 0, fmt.Errorf("certificate %s: expected a member identity, found %s", describe(cert), id)
	}
	return id.Member, nil
}

// ClientFromCert returns the client name and role a client certificate
// names.
func ClientFromCert(cert *x509.Certificate) (string, Role, error) {
	id, err := IdentityFromCert(cert)
	if err != nil {
		return "", 0, err
	}
	if id.Kind != KindClient {
		return "", 0, fmt.Errorf("certificate %s: expected a client identity, found %s", describe(cert), id)
	}
	return id.Name, id.Role, nil
}

// MemberFromState returns the member id of the peer at the other end of a
// TLS connection. Only a chain the handshake verified counts:
// PeerCertificates alone are whatever the peer sent.
func MemberFromState(cs *tls.ConnectionState) (uint64, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return 0, errors.New("connection has no verified certificate: the peer plane needs mutual TLS")
	}
	return MemberFromCert(cs.VerifiedChains[0][0])
}

func describe(cert *x509.Certificate) string {
	if cert.SerialNumber == nil {
		return fmt.Sprintf("%q", cert.Subject.CommonName)
	}
	return fmt.Sprintf("%q (serial %x)", cert.Subject.CommonName, cert.SerialNumber)
}
