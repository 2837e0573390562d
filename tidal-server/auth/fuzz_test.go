package auth

import (
	"bytes"
	"errors"
	"net/url"
	"strings"
	"testing"
)

// FuzzParseTokens: no input crashes the parser; every error is a
// *TokenError naming a line and a known field; whatever it accepts is
// valid, and writing the tokens back out reads back the same tokens.
func FuzzParseTokens(f *testing.F) {
	h := HashSecret("seed-secret-0123456789")
	f.Add([]byte("alice admin " + h + "\n"))
	f.Add([]byte("# c\n\nbob\treader\t" + h + " # x\r\n"))
	f.Add([]byte("alice admin " + h + "\nalice reader " + HashSecret("other-0123456789") + "\n"))
	f.Add([]byte("a b c d\n"))
	f.Add([]byte("\xef\xbb\xbfx writer sha256:" + strings.Repeat("0", 64)))
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseTokens(bytes.NewReader(data), "fuzz")
		if err != nil {
			var te *TokenError
			if !errors.As(err, &te) {
				t.Fatalf("error %v (%T); expected a *TokenError", err, err)
			}
			if te.Line < 1 || te.Path != "fuzz" {
				t.Fatalf("error %q names line %d of %q", err, te.Line, te.Path)
			}
			switch te.Field {
			case "", "name", "role", "hash":
			default:
				t.Fatalf("error %q names field %q", err, te.Field)
			}
			return
		}
		names := map[string]bool{}
		var out strings.Builder
		for _, tok := range tokens {
			if ValidName(tok.Name) != nil || !tok.Role.Valid() || names[tok.Name] {
				t.Fatalf("accepted an invalid or duplicate token %+v", tok)
			}
			names[tok.Name] = true
			out.WriteString(tok.String() + "\n")
		}
		again, err := ParseTokens(strings.NewReader(out.String()), "again")
		if err != nil {
			t.Fatalf("the accepted tokens, written back, do not parse: %v\n%s", err, out.String())
		}
		if len(again) != len(tokens) {
			t.Fatalf("round trip: %d tokens; expected %d", len(again), len(tokens))
		}
		for i := range again {
			if again[i].Name != tokens[i].Name || again[i].Role != tokens[i].Role || again[i].Hash != tokens[i].Hash {
				t.Fatalf("round trip: token %d = %+v; expected %+v", i, again[i], tokens[i])
			}
		}
	})
}

// FuzzIdentityFromCert: URI SANs, through a real certificate's encoding
// and parsing, never crash identity extraction; an identity is accepted
// only from exactly one tidal:// URI, which is then the identity's
// canonical form (one identity, one spelling), and the Member/Client
// accessors agree with it.
func FuzzIdentityFromCert(f *testing.F) {
	for _, seed := range [][2]string{
		{"tidal://member/1", ""},
		{"tidal://client/alice?role=admin", ""},
		{"tidal://client/alice", ""},
		{"tidal://member/01", ""},
		{"tidal://member/1", "tidal://client/a?role=reader"},
		{"spiffe://x/y", "tidal://member/9"},
		{"tidal://client/a%2Fb?role=writer", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		var uris []string
		for _, s := range []string{a, b} {
			if s != "" {
				uris = append(uris, s)
			}
		}
		cert, err := certWithURIs(t, false, uris...)
		if err != nil {
			return // not a URI, or not one x509 will encode
		}
		id, err := IdentityFromCert(cert)
		member, merr := MemberFromCert(cert)
		name, role, cerr := ClientFromCert(cert)
		if err != nil {
			if merr == nil || cerr == nil {
				t.Fatalf("IdentityFromCert refused (%v) but MemberFromCert = %d, %v and ClientFromCert = %q, %v", err, member, merr, name, cerr)
			}
			return
		}
		var tidal []*url.URL
		for _, u := range cert.URIs {
			if strings.EqualFold(u.Scheme, URIScheme) {
				tidal = append(tidal, u)
			}
		}
		if len(tidal) != 1 {
			t.Fatalf("accepted %+v from %d tidal URIs %v", id, len(tidal), cert.URIs)
		}
		if canonical := id.URI().String(); canonical != tidal[0].String() {
			t.Fatalf("accepted %+v from %q, which is not its canonical form %q", id, tidal[0], canonical)
		}
		back, err := ParseIdentityURI(id.URI())
		if err != nil || back != id {
			t.Fatalf("the canonical URI of %+v parses as %+v, %v", id, back, err)
		}
		switch id.Kind {
		case KindMember:
			if id.Member == 0 || merr != nil || member != id.Member || cerr == nil {
				t.Fatalf("member %+v: MemberFromCert %d %v, ClientFromCert err %v", id, member, merr, cerr)
			}
		case KindClient:
			if ValidName(id.Name) != nil || !id.Role.Valid() || cerr != nil || name != id.Name || role != id.Role || merr == nil {
				t.Fatalf("client %+v: ClientFromCert %q %v %v, MemberFromCert err %v", id, name, role, cerr, merr)
			}
		default:
			t.Fatalf("accepted an identity of kind %v", id.Kind)
		}
	})
}
