package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
)

// NewSecret returns a fresh bearer secret: 32 random bytes, base64url
// without padding (43 characters, safe in a header and a shell).
func NewSecret() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// CheckSecret refuses a secret a person chose badly: shorter than
// MinSecretLen (the tokens file keeps a fast hash, so a short secret
// could be guessed from a leaked file), or with characters an
// Authorization header would not carry intact (spaces, controls,
// non-ASCII).
func CheckSecret(secret string) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("secret: expected at least %d characters, found %d (the tokens file keeps a fast hash; a short secret could be guessed from it)", MinSecretLen, len(secret))
	}
	for i := 0; i < len(secret); i++ {
		if c := secret[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("secret: expected printable ASCII without spaces, found %q at offset %d", c, i)
		}
	}
	return nil
}

// AppendToken adds the line "name role sha256:HEX(secret)" to the tokens
// file at path, creating it (mode 0600) if needed. The file as it stands
// must parse, and the name and the secret must be new to it. The file is
// replaced atomically (temporary file, fsync, rename, fsync of the
// directory), so a running node's Reload sees the old file or the new
// one, never half of it.
func AppendToken(path, name string, role Role, secret string) (Token, error) {
	if err := ValidName(name); err != nil {
		return Token{}, err
	}
	if !role.Valid() {
		return Token{}, fmt.Errorf("role: expected reader, writer or admin, found %s", role)
	}
	if err := CheckSecret(secret); err != nil {
		return Token{}, err
	}
	mode := fs.FileMode(0o600)
	old, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return Token{}, err
	default:
		if st, err := os.Stat(path); err == nil {
			mode = st.Mode().Perm()
		}
	}
	tokens, err := ParseTokens(bytes.NewReader(old), path)
	if err != nil {
		return Token{}, err
	}
	probe := NewTokens(tokens)
	if tok, ok := probe.Lookup(secret); ok {
		return Token{}, fmt.Errorf("%s:%d: this secret is already the token of %q; use a new secret", path, tok.Line, tok.Name)
	}
	for _, t := range tokens {
		if t.Name == name {
			return Token{}, fmt.Errorf("%s:%d: %q already has a token; remove that line first to replace it", path, t.Line, name)
		}
	}
	tok, err := ParseTokens(bytes.NewReader([]byte(name+" "+role.String()+" "+HashSecret(secret))), path)
	if err != nil {
		return Token{}, err
	}
	data := old
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, tok[0].String()+"\n"...)
	if err := atomicfile.Write(path, data, mode); err != nil {
		return Token{}, err
	}
	tok[0].Line = bytes.Count(data, []byte("\n"))
	return tok[0], nil
}
