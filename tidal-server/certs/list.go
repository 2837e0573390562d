package certs

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

// Entry describes one certificate of a certs directory.
type Entry struct {
	File     string // base name: ca.crt, node.crt, client.NAME.crt
	Kind     string // "ca", "node" or "client"
	Identity string // "member 3", "client alice", or the CA's subject
	Role     string // a client's role
	Hosts    []string
	NotAfter time.Time
	// Problems say why the certificate would not work: expired, not
	// signed by ca.crt, key missing or not matching, identity refused.
	Problems []string
}

// List describes ca.crt (every certificate of the bundle), node.crt and
// each client.NAME.crt in dir, checked as of now. A certificate that does
// not parse is listed with its problem; only an unreadable directory is
// an error.
func List(dir string, now time.Time) ([]Entry, error) {
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	pool := x509.NewCertPool()
	caPath := filepath.Join(dir, CACertFile)
	cas, caErr := readCerts(caPath)
	_, statErr := os.Stat(caPath)
	switch {
	case caErr == nil:
		for _, c := range cas {
			pool.AddCert(c)
			e := Entry{File: CACertFile, Kind: "ca", Identity: c.Subject.String(), NotAfter: c.NotAfter}
			if !c.IsCA {
				e.Problems = append(e.Problems, "not a CA certificate")
			}
			e.Problems = appendValidity(e.Problems, c, now)
			out = append(out, e)
		}
	case !errors.Is(statErr, fs.ErrNotExist):
		out = append(out, Entry{File: CACertFile, Kind: "ca", Problems: []string{caErr.Error()}})
	}
	var files []string
	for _, n := range names {
		name := n.Name()
		if name == NodeCertFile || strings.HasPrefix(name, "client.") && strings.HasSuffix(name, ".crt") {
			files = append(files, name)
		}
	}
	sort.Strings(files)
	for _, f := range files {
		out = append(out, describeLeaf(dir, f, pool, caErr == nil, now))
	}
	return out, nil
}

func describeLeaf(dir, file string, pool *x509.CertPool, haveCA bool, now time.Time) Entry {
	e := Entry{File: file, Kind: "client"}
	keyFile := strings.TrimSuffix(file, ".crt") + ".key"
	if file == NodeCertFile {
		e.Kind, keyFile = "node", NodeKeyFile
	}
	chain, err := readCerts(filepath.Join(dir, file))
	if err != nil {
		e.Problems = append(e.Problems, err.Error())
		return e
	}
	leaf := chain[0]
	e.NotAfter = leaf.NotAfter
	e.Hosts = append(e.Hosts, leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		e.Hosts = append(e.Hosts, ip.String())
	}
	if id, err := auth.IdentityFromCert(leaf); err != nil {
		e.Problems = append(e.Problems, err.Error())
	} else {
		switch id.Kind {
		case auth.KindMember:
			e.Identity = fmt.Sprintf("member %d", id.Member)
		case auth.KindClient:
			e.Identity, e.Role = "client "+id.Name, id.Role.String()
		}
		if e.Kind == "node" && id.Kind != auth.KindMember || e.Kind == "client" && id.Kind != auth.KindClient {
			e.Problems = append(e.Problems, fmt.Sprintf("a %s file holding a %s identity", e.Kind, id.Kind))
		}
		if id.Kind == auth.KindClient && file != ClientCertFile(id.Name) {
			e.Problems = append(e.Problems, fmt.Sprintf("names client %q, expected file %s", id.Name, ClientCertFile(id.Name)))
		}
	}
	e.Problems = appendValidity(e.Problems, leaf, now)
	if haveCA {
		// Validity was reported above; the chain is checked at the
		// leaf's own NotBefore so an expired certificate still says
		// whether its CA is the right one.
		opts := x509.VerifyOptions{Roots: pool, CurrentTime: leaf.NotBefore.Add(time.Second), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		if _, err := leaf.Verify(opts); err != nil {
			var unknown x509.UnknownAuthorityError
			if errors.As(err, &unknown) {
				e.Problems = append(e.Problems, "not signed by any CA in "+CACertFile)
			} else {
				e.Problems = append(e.Problems, err.Error())
			}
		}
	}
	if key, err := readKey(filepath.Join(dir, keyFile)); err != nil {
		e.Problems = append(e.Problems, err.Error())
	} else if !sameKey(leaf, key) {
		e.Problems = append(e.Problems, keyFile+" does not match")
	}
	return e
}

func appendValidity(problems []string, c *x509.Certificate, now time.Time) []string {
	switch {
	case now.After(c.NotAfter):
		return append(problems, "expired")
	case now.Before(c.NotBefore):
		return append(problems, "not yet valid (check the clock)")
	}
	return problems
}
