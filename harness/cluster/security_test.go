package cluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// A secured cluster's material: client certificates and
// tokens for every role, and node certificates that follow the member id
// in the slot (a slot added back as a new member gets a new one).
func TestSecurityMaterial(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	sec, err := newSecurity(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(sec.TokensFile)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := auth.ParseTokens(f, sec.TokensFile)
	f.Close()
	if err != nil || len(toks) != 3 {
		t.Fatalf("tokens file: expected 3 tokens, got %v, %v", toks, err)
	}
	var secrets map[string]string
	data, _ := os.ReadFile(filepath.Join(dir, tokensSecretsFile))
	if err := json.Unmarshal(data, &secrets); err != nil {
		t.Fatal(err)
	}
	set := auth.NewTokens(toks)
	for _, role := range []string{RoleAdmin, RoleWriter, RoleReader} {
		if sec.TLS(role) == nil || len(sec.TLS(role).Certificates) != 1 {
			t.Errorf("%s: expected a client certificate", role)
		}
		tok, ok := set.Lookup(secrets[role])
		if !ok || tok.Role.String() != role || sec.Token(role) != secrets[role] {
			t.Errorf("%s: expected its token in the tokens file with that role, found %+v %v", role, tok, ok)
		}
	}
	node := t.TempDir()
	nd, err := sec.nodeCerts(node, 2)
	if err != nil {
		t.Fatal(err)
	}
	st, err := certs.Load(nd)
	if err != nil || st.Member() != 2 {
		t.Fatalf("node certs: expected member 2, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(nd, "tokens")); err != nil {
		t.Fatal("the node's certs dir lacks the tokens file")
	}
	if nd, err = sec.nodeCerts(node, 7); err != nil {
		t.Fatal(err)
	}
	if st, err = certs.Load(nd); err != nil || st.Member() != 7 {
		t.Fatalf("a slot given a new member: expected its certificate to name member 7, got %v", err)
	}
}
