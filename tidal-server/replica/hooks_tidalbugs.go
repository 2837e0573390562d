//go:build tidalbugs

package replica

// Hooks that let a process stand for a newer release (tidal-server's
// hidden --test-newer-format, and other packages' tagged tests). They
// exist only in a tidalbugs build; the state they set is unexported and
// this package's own tests set it directly.

// SetTestNewerFormat makes this process write and read snapshot files
// one version above SnapshotFormatVersion, standing for a newer release.
func SetTestNewerFormat() {
	snapWriteVersion, snapReadVersion = SnapshotFormatVersion+1, SnapshotFormatVersion+1
}

// SetTestNewerEntryFormat makes this process advertise, and accept, one
// entry format above EntryFormat; restore undoes it.
func SetTestNewerEntryFormat() (restore func()) {
	testEntryFormat.Store(EntryFormat + 1)
	return func() { testEntryFormat.Store(0) }
}
