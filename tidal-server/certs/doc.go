// Package certs makes and loads the certificates of a secured tidal
// cluster, in the manner of CockroachDB's `cockroach cert`.
//
// A certs directory holds:
//
//	ca.crt               the cluster CA (a bundle: during a CA rotation it
//	                     holds the new and the old CA certificates)
//	ca.key               the CA key; keep it off the nodes (--ca-key)
//	node.crt, node.key   this node: URI SAN tidal://member/N plus its host
//	                     names and IPs, usable as TLS server and client
//	client.NAME.crt/key  a client: URI SAN tidal://client/NAME?role=ROLE
//
// Keys are ECDSA P-256, written 0600 and atomically (temporary file,
// fsync, rename, fsync of the directory); an existing key or certificate
// is never replaced unless asked (Overwrite). Identities are read by
// package auth (auth.MemberFromCert, auth.ClientFromCert).
//
// Load reads a node's directory and returns TLS configurations for the
// client plane (TLS 1.2+, ALPN h2 and http/1.1, client certificates
// optional and verified against ca.crt) and the peer plane (TLS 1.3,
// mutual, every peer a member of the CA). They re-read the files when
// they change, so certificates rotate without a restart.
package certs
