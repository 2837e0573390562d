//go:build tidalbugs

package peer

// SetTestNewerProtocol makes this process speak a protocol one above
// ProtocolVersion that no longer talks to ProtocolVersion, standing for a
// future incompatible release. It exists only in a tidalbugs build
// (tidal-server's hidden --test-newer-format).
func SetTestNewerProtocol() { testProtocolBump.Store(1) }
