package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// File names inside a certs directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// ClientCertFile is the certificate file of client name.
func ClientCertFile(name string) string { return "client." + name + ".crt" }

// ClientKeyFile is the key file of client name.
func ClientKeyFile(name string) string { return "client." + name + ".key" }

const (
	keyMode  fs.FileMode = 0o600
	certMode fs.FileMode = 0o644
	dirMode  fs.FileMode = 0o700
)

// refuseExisting fails when any of paths exists, unless overwrite.
func refuseExisting(overwrite bool, paths ...string) error {
	if overwrite {
		return nil
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s already exists; pass --overwrite to replace it", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// readCerts reads every CERTIFICATE block of a PEM file. Errors name the
// file.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fileError(path, err)
	}
	certs, err := parseCerts(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d: expected CERTIFICATE, found %q", n, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("expected PEM CERTIFICATE blocks, found none")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("unexpected data after PEM block %d", len(certs))
	}
	return certs, nil
}

// readKey reads a private key, refusing one that others may read, or a
// group other than through root's choice (CheckKeyPermissions, as
// CockroachDB does): a node key readable by every local user is a member
// identity anyone on the machine can take.
func readKey(path string) (crypto.Signer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fileError(path, err)
	}
	if err := checkKeyFile(path, st); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fileError(path, err)
	}
	key, err := parseKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("expected a PEM private key, found no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("expected PEM block PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY, found %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("unsupported private key type %T", key)
}

// sameKey reports whether a certificate's public key is the key's.
func sameKey(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(key.Public())
}

func fileError(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: missing (create it with `tidal-server certs ...`)", path)
	}
	return err
}
