package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// plainHTTPToTLS is what net/http's server answers (400, with this body)
// to a plain HTTP request on its TLS port.
const plainHTTPToTLS = "Client sent an HTTP request to an HTTPS server."

// TLSError is a connection the TLS handshake refused, or a TLS client
// that reached a plaintext node: no request was delivered. It is never
// retried, since the next attempt would meet the same certificates.
type TLSError struct {
	Addr string // the base URL
	Msg  string // what is wrong, in the node's and the client's terms
	Err  error  // what crypto/tls or net/http said
}

func (e *TLSError) Error() string { return fmt.Sprintf("tls: %s: %s: %v", e.Addr, e.Msg, e.Err) }
func (e *TLSError) Unwrap() error { return e.Err }

// IsTLS reports whether err is a TLS problem between client and node
// (wrong CA, wrong host name, a refused client certificate, or one side
// without TLS).
func IsTLS(err error) bool {
	var te *TLSError
	return errors.As(err, &te)
}

// tlsProblem recognises a transport error as a failed TLS set-up and says
// what it means; nil for anything else (a refused or dropped connection).
func (c *Client) tlsProblem(err error) error {
	var (
		rh       tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
	)
	msg := ""
	switch {
	case errors.As(err, &rh), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		msg = "the node does not serve TLS (it was started without --certs-dir): use an http:// address and no TLS options"
	case errors.As(err, &unknown):
		msg = "the node's certificate is not signed by a CA this client trusts (ca.crt of the cluster?)"
	case errors.As(err, &hostname):
		msg = "the node's certificate does not name the address dialled (certs create-node --host)"
	case errors.As(err, &invalid):
		msg = "the node's certificate is not valid (expired, not yet valid, or not for a TLS server)"
	case errors.As(err, &verify):
		msg = "the node's certificate did not verify"
	case errors.As(err, &alert), isRemoteAlert(err):
		msg = "the node refused the TLS handshake (a client certificate from another CA, or expired?)"
	default:
		return nil
	}
	return &TLSError{Addr: c.base, Msg: msg, Err: err}
}

// isRemoteAlert recognises an alert the node sent during the handshake.
// crypto/tls reports it as a *net.OpError wrapping a tls.AlertError on
// most paths, but as text on some (HTTP/2's connection set-up), so the
// text is checked too.
func isRemoteAlert(err error) bool {
	return strings.Contains(err.Error(), "remote error: tls:")
}
