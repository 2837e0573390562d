package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	testKeyOnce sync.Once
	testKey     *ecdsa.PrivateKey
)

// certWithURIs makes a self-signed certificate carrying the given URI
// SANs, through x509.CreateCertificate and back through
// x509.ParseCertificate, as a peer's certificate arrives. Identity
// extraction reads names only, so no CA is needed here.
func certWithURIs(tb testing.TB, isCA bool, uris ...string) (*x509.Certificate, error) {
	tb.Helper()
	testKeyOnce.Do(func() {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		testKey = k
	})
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(7),
		Subject:               pkix.Name{CommonName: "test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		BasicConstraintsValid: true,
		IsCA:                  isCA,
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			return nil, err
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, testKey.Public(), testKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func mustCert(t *testing.T, isCA bool, uris ...string) *x509.Certificate {
	t.Helper()
	c, err := certWithURIs(t, isCA, uris...)
	if err != nil {
		t.Fatalf("making a certificate with %q: %v", uris, err)
	}
	return c
}

func TestIdentityFromCertAcceptsCanonicalForms(t *testing.T) {
	cases := []struct {
		uris []string
		want Identity
	}{
		{[]string{"tidal://member/1"}, Identity{Kind: KindMember, Member: 1}},
		{[]string{"tidal://member/18446744073709551615"}, Identity{Kind: KindMember, Member: 1<<64 - 1}},
		{[]string{"tidal://client/alice?role=reader"}, Identity{Kind: KindClient, Name: "alice", Role: Reader}},
		{[]string{"tidal://client/ci-bot.2_x?role=writer"}, Identity{Kind: KindClient, Name: "ci-bot.2_x", Role: Writer}},
		{[]string{"tidal://client/ops?role=admin"}, Identity{Kind: KindClient, Name: "ops", Role: Admin}},
		// URI SANs of other schemes (a SPIFFE id from a corporate PKI)
		// are not identities and do not make the certificate ambiguous.
		{[]string{"spiffe://example.org/ns/x", "tidal://member/4"}, Identity{Kind: KindMember, Member: 4}},
	}
	for _, c := range cases {
		got, err := IdentityFromCert(mustCert(t, false, c.uris...))
		if err != nil || got != c.want {
			t.Errorf("IdentityFromCert(%q) = %+v, %v; expected %+v", c.uris, got, err, c.want)
			continue
		}
		if got.URI().String() != c.uris[len(c.uris)-1] {
			t.Errorf("identity %+v renders as %q; expected %q", got, got.URI(), c.uris[len(c.uris)-1])
		}
	}
}

func TestIdentityFromCertRefuses(t *testing.T) {
	cases := []struct {
		name string
		isCA bool
		uris []string
		want string // in the error
	}{
		{"no identity", false, nil, "no identity"},
		{"only other schemes", false, []string{"spiffe://x/y"}, "no identity"},
		{"two members", false, []string{"tidal://member/1", "tidal://member/2"}, "exactly one"},
		{"the same member twice", false, []string{"tidal://member/1", "tidal://member/1"}, "exactly one"},
		{"member and client", false, []string{"tidal://member/1", "tidal://client/a?role=admin"}, "exactly one"},
		{"CA certificate", true, []string{"tidal://member/1"}, "CA certificate"},
		{"client without role", false, []string{"tidal://client/alice"}, "no role"},
		{"client with empty query", false, []string{"tidal://client/alice?"}, "expected tidal://member/N"},
		{"client unknown role", false, []string{"tidal://client/alice?role=root"}, "found \"root\""},
		{"client role twice", false, []string{"tidal://client/alice?role=admin&role=reader"}, "found \"admin&role=reader\""},
		{"client other query", false, []string{"tidal://client/alice?x=1&role=admin"}, "expected query role=ROLE"},
		{"client upper-case name", false, []string{"tidal://client/Alice?role=admin"}, "expected a-z"},
		{"client escaped name", false, []string{"tidal://client/al%69ce?role=admin"}, "canonical"},
		{"client escaped slash", false, []string{"tidal://client/a%2Fb?role=admin"}, "path"},
		{"client empty name", false, []string{"tidal://client/?role=admin"}, "empty name"},
		{"client long name", false, []string{"tidal://client/" + strings.Repeat("a", 65) + "?role=admin"}, "at most 64"},
		{"member zero", false, []string{"tidal://member/0"}, "found 0"},
		{"member leading zero", false, []string{"tidal://member/01"}, "canonical"},
		{"member plus sign", false, []string{"tidal://member/+1"}, "member id"},
		{"member negative", false, []string{"tidal://member/-1"}, "member id"},
		{"member too big", false, []string{"tidal://member/18446744073709551616"}, "member id"},
		{"member with query", false, []string{"tidal://member/1?role=admin"}, "no query"},
		{"member with fragment", false, []string{"tidal://member/1#x"}, "expected tidal://member/N"},
		{"member with port", false, []string{"tidal://member:80/1"}, "kind member or client"},
		{"member with user", false, []string{"tidal://x@member/1"}, "expected tidal://member/N"},
		{"member two segments", false, []string{"tidal://member/1/2"}, "one path segment"},
		{"member no path", false, []string{"tidal://member"}, "one path segment"},
		{"upper-case kind", false, []string{"tidal://MEMBER/1"}, "kind member or client"},
		{"unknown kind", false, []string{"tidal://node/1"}, "kind member or client"},
		{"opaque", false, []string{"tidal:member/1"}, "expected tidal://member/N"},
	}
	for _, c := range cases {
		cert := mustCert(t, c.isCA, c.uris...)
		id, err := IdentityFromCert(cert)
		if err == nil {
			t.Errorf("%s: IdentityFromCert(%q) = %+v; expected an error containing %q", c.name, c.uris, id, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: IdentityFromCert(%q) error %q; expected it to contain %q", c.name, c.uris, err, c.want)
		}
	}
}

func TestMemberAndClientFromCertInsistOnTheKind(t *testing.T) {
	member := mustCert(t, false, "tidal://member/3")
	client := mustCert(t, false, "tidal://client/bob?role=writer")
	if id, err := MemberFromCert(member); err != nil || id != 3 {
		t.Errorf("MemberFromCert(member 3) = %d, %v", id, err)
	}
	if id, err := MemberFromCert(client); err == nil {
		t.Errorf("MemberFromCert(client bob) = %d; expected an error: a client is not a member", id)
	}
	if name, role, err := ClientFromCert(client); err != nil || name != "bob" || role != Writer {
		t.Errorf("ClientFromCert(bob) = %q, %v, %v", name, role, err)
	}
	if name, _, err := ClientFromCert(member); err == nil {
		t.Errorf("ClientFromCert(member 3) = %q; expected an error: a member is not a client", name)
	}
	if _, err := IdentityFromCert(nil); err == nil {
		t.Error("IdentityFromCert(nil): expected an error")
	}
}

// MemberFromState must read only what the handshake verified: a
// connection whose peer sent a certificate that was not verified (no
// VerifiedChains) names nobody.
func TestMemberFromStateNeedsAVerifiedChain(t *testing.T) {
	member := mustCert(t, false, "tidal://member/2")
	unverified := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{member}}
	if id, err := MemberFromState(unverified); err == nil {
		t.Errorf("MemberFromState(unverified member 2) = %d; expected an error", id)
	}
	if _, err := MemberFromState(nil); err == nil {
		t.Error("MemberFromState(nil): expected an error")
	}
	verified := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{member}, VerifiedChains: [][]*x509.Certificate{{member}}}
	if id, err := MemberFromState(verified); err != nil || id != 2 {
		t.Errorf("MemberFromState(verified member 2) = %d, %v", id, err)
	}
}

func TestClientIdentityValidates(t *testing.T) {
	if _, err := ClientIdentity("alice", 0); err == nil {
		t.Error("ClientIdentity(alice, no role): expected an error")
	}
	if _, err := ClientIdentity("-alice", Reader); err == nil {
		t.Error("ClientIdentity(-alice): expected an error (names start with a letter or digit)")
	}
	if _, err := MemberIdentity(0); err == nil {
		t.Error("MemberIdentity(0): expected an error")
	}
}
