package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hashOf is the tokens-file hash of secret.
func hashOf(secret string) string { return HashSecret(secret) }

func TestHashSecretIsSHA256Hex(t *testing.T) {
	// SHA-256("abc"), FIPS 180-2 appendix B.1.
	const want = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := HashSecret("abc"); got != want {
		t.Errorf("HashSecret(abc) = %s; expected %s", got, want)
	}
}

func TestParseTokensReadsCommentsBlanksAndCRLF(t *testing.T) {
	file := "\xef\xbb\xbf# tokens for the staging cluster\r\n" +
		"\r\n" +
		"alice   admin  " + hashOf("alice-secret-0123456789") + "   # on-call\r\n" +
		"\t# indented comment\n" +
		"ci-bot\twriter\t" + hashOf("ci-secret-0123456789") + "\n" +
		"dash reader " + hashOf("dash-secret-0123456789") // no final newline
	tokens, err := ParseTokens(strings.NewReader(file), "tokens.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		role Role
		line int
	}{{"alice", Admin, 3}, {"ci-bot", Writer, 5}, {"dash", Reader, 6}}
	if len(tokens) != len(want) {
		t.Fatalf("parsed %d tokens; expected %d: %+v", len(tokens), len(want), tokens)
	}
	for i, w := range want {
		if tokens[i].Name != w.name || tokens[i].Role != w.role || tokens[i].Line != w.line {
			t.Errorf("token %d = %s (line %d); expected %s %s (line %d)", i, tokens[i], tokens[i].Line, w.name, w.role, w.line)
		}
	}
	set := NewTokens(tokens)
	if tok, ok := set.Lookup("ci-secret-0123456789"); !ok || tok.Name != "ci-bot" {
		t.Errorf("Lookup(ci secret) = %+v, %v; expected ci-bot", tok, ok)
	}
	for _, wrong := range []string{"", "ci-secret-012345678", "ci-secret-0123456789 ", hashOf("ci-secret-0123456789")} {
		if tok, ok := set.Lookup(wrong); ok {
			t.Errorf("Lookup(%q) = %+v; expected no token", wrong, tok)
		}
	}
}

func TestParseTokensNamesTheBadLineAndField(t *testing.T) {
	good := "ok reader " + hashOf("ok-secret-0123456789")
	h := hashOf("another-secret-0123456789")
	cases := []struct {
		name, line, field, want string
	}{
		{"two fields", "alice admin", "", "expected 3 fields"},
		{"four fields", "alice admin " + h + " extra", "", "expected 3 fields"},
		{"bad name", "Alice admin " + h, "name", "expected a-z"},
		{"name with slash", "a/b admin " + h, "name", "expected a-z"},
		{"bad role", "alice root " + h, "role", `found "root"`},
		{"no hash prefix", "alice admin " + strings.TrimPrefix(h, HashPrefix), "hash", "expected sha256:HEX"},
		{"clear secret", "alice admin hunter2", "hash", "expected sha256:HEX"},
		{"short hash", "alice admin " + h[:len(h)-1], "hash", "64 lower-case hex"},
		{"long hash", "alice admin " + h + "0", "hash", "64 lower-case hex"},
		{"very long hash", "alice admin " + h + strings.Repeat("0", 200), "hash", "64 lower-case hex"},
		{"upper-case hash", "alice admin " + strings.ToUpper(h[:10]) + h[10:], "hash", "expected sha256:HEX"},
		{"upper-case hex", "alice admin " + HashPrefix + strings.ToUpper(strings.TrimPrefix(h, HashPrefix)), "hash", "64 lower-case hex"},
		{"not hex", "alice admin " + HashPrefix + strings.Repeat("zz", 32), "hash", "64 lower-case hex"},
		{"duplicate name", "ok admin " + h, "name", "already defined on line 2"},
		{"duplicate secret", "other admin " + hashOf("ok-secret-0123456789"), "hash", "already used on line 2"},
	}
	for _, c := range cases {
		file := "# header\n" + good + "\n\n" + c.line + "\n"
		_, err := ParseTokens(strings.NewReader(file), "/etc/tidal/tokens")
		var te *TokenError
		if !errors.As(err, &te) {
			t.Errorf("%s: ParseTokens = %v; expected a *TokenError", c.name, err)
			continue
		}
		if te.Line != 4 || te.Field != c.field || te.Path != "/etc/tidal/tokens" || !strings.Contains(te.Msg, c.want) {
			t.Errorf("%s: error %q (line %d, field %q); expected line 4, field %q, message containing %q", c.name, err, te.Line, te.Field, c.field, c.want)
		}
		if !strings.HasPrefix(err.Error(), "/etc/tidal/tokens:4: ") {
			t.Errorf("%s: error %q; expected it to start with the file and line", c.name, err)
		}
	}
}

func TestParseTokensRefusesAnOverlongLine(t *testing.T) {
	file := "ok reader " + hashOf("ok-secret-0123456789") + "\n" + strings.Repeat("x", maxTokenLine+1) + "\n"
	_, err := ParseTokens(strings.NewReader(file), "t")
	var te *TokenError
	if !errors.As(err, &te) || te.Line != 2 {
		t.Errorf("ParseTokens(overlong line 2) = %v; expected a *TokenError on line 2", err)
	}
}

// Regression-style guard for SIGHUP: a reload that meets a bad file keeps
// every token in use and says what is wrong and where.
func TestReloadKeepsTheOldTokensOnABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alice admin " + hashOf("alice-secret-0123456789") + "\n")
	set, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	write("alice admin " + hashOf("alice-secret-0123456789") + "\nbob superuser " + hashOf("bob-secret-0123456789") + "\n")
	err = set.Reload()
	if err == nil || !strings.Contains(err.Error(), path+":2: role") {
		t.Fatalf("Reload(bad line 2) = %v; expected an error naming %s:2: role", err, path)
	}
	if tok, ok := set.Lookup("alice-secret-0123456789"); !ok || tok.Role != Admin {
		t.Errorf("after a failed reload, alice = %+v, %v; expected the old admin token", tok, ok)
	}
	if _, ok := set.Lookup("bob-secret-0123456789"); ok {
		t.Error("after a failed reload, bob's token from the bad file is accepted")
	}
	os.Remove(path)
	if err := set.Reload(); err == nil {
		t.Error("Reload(missing file): expected an error")
	}
	if set.Len() != 1 {
		t.Errorf("after a failed reload of a missing file, %d tokens; expected the old 1", set.Len())
	}
	write("bob reader " + hashOf("bob-secret-0123456789") + "\n")
	if err := set.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Lookup("alice-secret-0123456789"); ok {
		t.Error("after a good reload, alice (removed from the file) is still accepted")
	}
	if tok, ok := set.Lookup("bob-secret-0123456789"); !ok || tok.Role != Reader {
		t.Errorf("after a good reload, bob = %+v, %v; expected reader", tok, ok)
	}
}

func TestLoadTokensReportsAMissingFile(t *testing.T) {
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "absent")); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("LoadTokens(absent) = %v; expected an error naming the file", err)
	}
}

func TestAppendToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	secret := NewSecret()
	if len(secret) != 43 {
		t.Errorf("NewSecret() = %q; expected 43 base64url characters", secret)
	}
	if secret == NewSecret() {
		t.Error("NewSecret returned the same secret twice")
	}
	tok, err := AppendToken(path, "alice", Admin, secret)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Line != 1 || tok.Name != "alice" || tok.Role != Admin {
		t.Errorf("AppendToken = %+v; expected alice admin on line 1", tok)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("new tokens file mode %#o; expected 0600", st.Mode().Perm())
	}
	// A hand-edited file without a final newline keeps its lines.
	data, _ := os.ReadFile(path)
	os.WriteFile(path, append(append([]byte("# ops\n"), data...), "bob reader "+HashSecret("bob-secret-0123456789")...), 0o600)
	os.Chmod(path, 0o640)
	if _, err := AppendToken(path, "carol", Writer, "carol-secret-0123456789"); err != nil {
		t.Fatal(err)
	}
	set, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	for secret, want := range map[string]string{secret: "alice", "bob-secret-0123456789": "bob", "carol-secret-0123456789": "carol"} {
		if tok, ok := set.Lookup(secret); !ok || tok.Name != want {
			t.Errorf("after AppendToken, Lookup = %+v, %v; expected %s", tok, ok, want)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("tokens file mode %#o after append; expected the file's own 0640 kept", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), "carol-secret") || strings.Contains(string(raw), secret) {
		t.Error("the tokens file holds a secret in clear")
	}
	for _, c := range []struct {
		name, secret, want string
	}{
		{"alice", "another-secret-0123456789", `"alice" already has a token`},
		{"dave", "carol-secret-0123456789", `already the token of "carol"`},
		{"dave", "short", "at least 16"},
		{"dave", "dave secret 0123456789", "without spaces"},
		{"dave", "dave-secret-0123456789\x00", "without spaces"},
		{"Dave", "dave-secret-0123456789", "expected a-z"},
	} {
		if _, err := AppendToken(path, c.name, Reader, c.secret); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("AppendToken(%s) = %v; expected an error containing %q", c.name, err, c.want)
		}
	}
	os.WriteFile(path, []byte("broken line\n"), 0o600)
	if _, err := AppendToken(path, "erin", Reader, "erin-secret-0123456789"); err == nil || !strings.Contains(err.Error(), path+":1") {
		t.Errorf("AppendToken to a broken file = %v; expected the file's error", err)
	}
}
