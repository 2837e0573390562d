// Package auth decides who a caller is and what it may do.
//
// Identities come from two places. A certificate signed by the cluster CA
// names its holder in a URI SAN: tidal://member/N for a cluster member
// (node.crt; the peer plane), tidal://client/NAME?role=ROLE for a client
// (client.NAME.crt; the client plane). A bearer token names a client and
// its role in the tokens file, which stores only the SHA-256 of each
// secret. Roles are ordered: reader < writer < admin.
//
// Handler is the client plane's HTTP middleware: it authenticates a
// request (verified client certificate, or Authorization: Bearer), looks
// up the role the route needs in a Policy and answers 401 or 403 as the
// API's JSON error before the request reaches the API.
//
// The formats and the route table are recorded in docs/ARCHITECTURE.md
// ("Security: certificates, identities, tokens").
package auth
