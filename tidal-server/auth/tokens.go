package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// The tokens file has one token per line:
//
//	# comment
//	NAME ROLE sha256:HEX    # trailing comment
//
// NAME follows ValidName, ROLE is reader, writer or admin, HEX is the
// lower-case hex SHA-256 of the secret (64 characters). Fields are
// separated by spaces or tabs; '#' starts a comment; blank lines are
// ignored. Names and hashes are unique. The file never holds a secret:
// `tidal-server tokens add` generates one, prints it once and appends its
// line. SHA-256 is fast, so secrets must be high-entropy (generated, or
// at least MinSecretLen characters); they are not passwords.

// HashPrefix marks the hash algorithm of a token line's third field.
const HashPrefix = "sha256:"

// MinSecretLen is the shortest secret HashSecret's callers accept from a
// person: a fast hash of a short secret could be brute-forced from a
// leaked tokens file.
const MinSecretLen = 16

// maxTokenLine bounds one line of the tokens file; a valid line is about
// 150 bytes, so anything this long is not a tokens file.
const maxTokenLine = 4096

// Token is one line of the tokens file.
type Token struct {
	Name string
	Role Role
	Hash [sha256.Size]byte
	Line int // 1-based line in its file
}

// String renders the token as a line of the tokens file (without newline).
func (t Token) String() string {
	return t.Name + " " + t.Role.String() + " " + HashPrefix + hex.EncodeToString(t.Hash[:])
}

// HashSecret returns the hash stored for secret, as the tokens file
// writes it (sha256:HEX).
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return HashPrefix + hex.EncodeToString(sum[:])
}

// TokenError is a bad line of a tokens file.
type TokenError struct {
	Path  string // the file, or a description of the source
	Line  int    // 1-based
	Field string // name, role or hash; "" for the line as a whole
	Msg   string
}

func (e *TokenError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.Path, e.Line, e.Field, e.Msg)
}

// ParseTokens reads a tokens file from r; path names it in errors. The
// first bad line is reported with its line number and field.
func ParseTokens(r io.Reader, path string) ([]Token, error) {
	var tokens []Token
	byName := map[string]int{}
	byHash := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), maxTokenLine)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Bytes()
		if line == 1 {
			text = bytes.TrimPrefix(text, []byte("\xef\xbb\xbf")) // a UTF-8 BOM some editors write
		}
		if i := bytes.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.FieldsFunc(string(text), func(c rune) bool { return c == ' ' || c == '\t' || c == '\r' })
		if len(fields) == 0 {
			continue
		}
		bad := func(field, format string, args ...any) error {
			return &TokenError{Path: path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
		}
		if len(fields) != 3 {
			return nil, bad("", "expected 3 fields NAME ROLE sha256:HEX, found %d", len(fields))
		}
		name, roleName, hash := fields[0], fields[1], fields[2]
		if err := ValidName(name); err != nil {
			return nil, bad("name", "%v", err)
		}
		role, err := ParseRole(roleName)
		if err != nil {
			return nil, bad("role", "%v", err)
		}
		digest, ok := strings.CutPrefix(hash, HashPrefix)
		if !ok {
			return nil, bad("hash", "expected %sHEX (the SHA-256 of the secret; see `tidal-server tokens hash`), found %q", HashPrefix, clip(hash))
		}
		var sum [sha256.Size]byte
		if len(digest) != hex.EncodedLen(sha256.Size) || strings.ToLower(digest) != digest || decodeHex(sum[:], digest) != nil {
			return nil, bad("hash", "expected 64 lower-case hex digits after %s, found %q", HashPrefix, clip(digest))
		}
		if prev, dup := byName[name]; dup {
			return nil, bad("name", "%q is already defined on line %d", name, prev)
		}
		if prev, dup := byHash[sum]; dup {
			return nil, bad("hash", "the same secret is already used on line %d: one secret must name one client", prev)
		}
		byName[name], byHash[sum] = line, line
		tokens = append(tokens, Token{Name: name, Role: role, Hash: sum, Line: line})
	}
	if err := sc.Err(); err != nil {
		if err == bufio.ErrTooLong {
			return nil, &TokenError{Path: path, Line: line + 1, Msg: fmt.Sprintf("line longer than %d bytes", maxTokenLine)}
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tokens, nil
}

// decodeHex decodes exactly len(dst) bytes; the caller checked the length.
func decodeHex(dst []byte, s string) error {
	_, err := hex.Decode(dst, []byte(s))
	return err
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Tokens is the set of bearer tokens the client plane accepts, read from
// a file and replaced as a whole by Reload. It is safe for concurrent use.
type Tokens struct {
	path   string
	mu     sync.Mutex // serializes Reload
	tokens atomic.Pointer[[]Token]
}

// LoadTokens reads the tokens file at path.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// NewTokens makes a fixed set (no file; Reload keeps it).
func NewTokens(tokens []Token) *Tokens {
	t := &Tokens{}
	cp := append([]Token(nil), tokens...)
	t.tokens.Store(&cp)
	return t
}

// Path is the file the set is read from ("" for a fixed set).
func (t *Tokens) Path() string { return t.path }

// Reload re-reads the file. On any error the set in use is kept
// unchanged and the error (naming file, line and field) is returned, so
// a typo during SIGHUP never locks every client out.
func (t *Tokens) Reload() error {
	if t.path == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	tokens, err := ParseTokens(f, t.path)
	if err != nil {
		return err
	}
	t.tokens.Store(&tokens)
	return nil
}

// Len is the number of tokens in use.
func (t *Tokens) Len() int {
	if p := t.tokens.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// Lookup finds the token whose hash is the secret's. Every token's hash is
// compared in constant time and the loop never stops early, so the time
// taken says nothing about which stored hash came close.
func (t *Tokens) Lookup(secret string) (Token, bool) {
	p := t.tokens.Load()
	if p == nil {
		return Token{}, false
	}
	sum := sha256.Sum256([]byte(secret))
	found := -1
	for i := range *p {
		if subtle.ConstantTimeCompare(sum[:], (*p)[i].Hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Token{}, false
	}
	return (*p)[found], true
}
