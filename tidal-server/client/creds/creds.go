// Package creds is the client side of a secured cluster as every tidal
// command spells it: --certs-dir, --cert-name, --token and --token-file,
// turned into the TLS configuration and bearer token a client presents.
//
// As CockroachDB's commands do with client.root, --certs-dir alone means
// "trust its ca.crt and present client.NAME.crt", NAME being --cert-name
// (each command picks its default: admin for the admin commands, writer
// for load). Given a token but no --cert-name, no certificate is
// presented: the token alone says who the client is.
package creds

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Flags are the four flags, bound to a flag set by Register.
type Flags struct {
	CertsDir  string
	CertName  string
	Token     string
	TokenFile string

	defaultName string
	set         *pflag.FlagSet
}

// Register adds the flags to fs; defaultName is the client certificate
// presented when --cert-name is not given ("admin", "writer").
func (f *Flags) Register(fs *pflag.FlagSet, defaultName string) {
	f.defaultName, f.set = defaultName, fs
	fs.StringVar(&f.CertsDir, "certs-dir", "", "speak HTTPS (HTTP/2) trusting DIR/ca.crt and presenting DIR/client.NAME.crt (see --cert-name)")
	fs.StringVar(&f.CertName, "cert-name", defaultName, "with --certs-dir: the client certificate to present, client.NAME.crt (tidal-server certs create-client NAME)")
	fs.StringVar(&f.Token, "token", "", "bearer token (visible in the process list; prefer --token-file)")
	fs.StringVar(&f.TokenFile, "token-file", "", "file whose first line is the bearer token")
}

// Credentials are what the flags resolved to.
type Credentials struct {
	TLS   *tls.Config // nil: plain HTTP
	Token string      // "": none
}

// Resolve reads the files the flags name. Every problem names its flag.
func (f *Flags) Resolve() (Credentials, error) {
	var c Credentials
	nameGiven := f.set != nil && f.set.Changed("cert-name")
	switch {
	case f.Token != "" && f.TokenFile != "":
		return c, errors.New("--token and --token-file: expected one, found both")
	case nameGiven && f.CertsDir == "":
		return c, fmt.Errorf("--cert-name %s: needs --certs-dir (the directory holding client.%s.crt and ca.crt)", f.CertName, f.CertName)
	}
	c.Token = f.Token
	if f.TokenFile != "" {
		tok, err := ReadTokenFile(f.TokenFile)
		if err != nil {
			return c, fmt.Errorf("--token-file: %w", err)
		}
		c.Token = tok
	}
	if f.CertsDir != "" {
		name := f.CertName
		if c.Token != "" && !nameGiven {
			name = "" // the token names the client; trust ca.crt only
		}
		cfg, err := certs.ClientTLS(f.CertsDir, name)
		if err != nil {
			return c, fmt.Errorf("--certs-dir: %w", err)
		}
		c.TLS = cfg
	}
	return c, nil
}

// Options are Resolve's credentials as client options.
func (f *Flags) Options() ([]client.Option, error) {
	c, err := f.Resolve()
	if err != nil {
		return nil, err
	}
	return c.Options(), nil
}

// Options are the client options that present c.
func (c Credentials) Options() []client.Option {
	var opts []client.Option
	if c.TLS != nil {
		opts = append(opts, client.WithTLS(c.TLS))
	}
	if c.Token != "" {
		opts = append(opts, client.WithToken(c.Token))
	}
	return opts
}

// ReadTokenFile returns the first line of path, without surrounding
// white space: the secret `tidal-server tokens add` printed.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 4096)).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	tok := strings.TrimSpace(line)
	if tok == "" {
		return "", fmt.Errorf("%s: expected a token on the first line, found none", path)
	}
	return tok, nil
}
