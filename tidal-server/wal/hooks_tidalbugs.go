//go:build tidalbugs

package wal

// SetTestNewerFormat makes this process write and read segments one
// format version above FormatVersion, standing for a newer release: every
// segment it creates is tagged and carries that version. It exists only
// in a tidalbugs build (tidal-server's hidden --test-newer-format): it
// lets a suite show that this build refuses the data dir such a release
// leaves.
func SetTestNewerFormat() {
	writeVersion, readVersion = FormatVersion+1, FormatVersion+1
}
