package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/harness/faultfs"
)

// defaultFaultfsControl is where `faultfs mount` serves its control API
// unless told otherwise, and where the other faultfs commands look for it.
const defaultFaultfsControl = "127.0.0.1:8476"

func newFaultfsCommand() *cobra.Command {
	var control string
	cmd := &cobra.Command{
		Use:   "faultfs",
		Short: "A FUSE filesystem that loses unsynced data on a power cut, fails fsync, fills up, slows down, corrupts reads",
		Long: `faultfs mounts a directory through FUSE and remembers what the program
using it made durable: file data after fsync/fdatasync of the file, directory
entries (create, rename, unlink, mkdir) after fsync of their directory. A
power cut rolls the backing directory back to exactly that, then remounts.
Faults: fsync-error (EIO, Linux's lost write-back semantics), disk-full
(ENOSPC past a quota), slow-disk (latency or a stall per operation class),
corrupt-read (flipped bits in a file range).

"mount" runs in the foreground and serves a control API; the other commands
drive it. Needs root (or fusermount3) and /dev/fuse. docs/ARCHITECTURE.md,
"faultfs: what durable means", has the exact semantics.`,
		Example: `  # serve node1's data dir through faultfs (the data lives in node1.disk)
  mkdir -p /tmp/node1.disk
  tidal-chaos faultfs mount --backing /tmp/node1.disk --mountpoint /tmp/node1 &

  # kill -9 the program using it, then lose everything it did not fsync
  tidal-chaos faultfs power-cut
  tidal-chaos faultfs power-cut --torn-writes --seed 7

  # fail the next fsync of a WAL segment, then every fsync until cleared
  tidal-chaos faultfs set fsync-error --path 'wal/*.wal'
  tidal-chaos faultfs set fsync-error --sticky

  tidal-chaos faultfs stats
  tidal-chaos faultfs clear`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&control, "control", defaultFaultfsControl, `control API address: host:port, or unix:/path/to.sock`)
	client := func() *faultfs.Client { return faultfs.NewClient(control) }
	cmd.AddCommand(
		newFaultfsMountCommand(&control),
		newFaultfsPowerCutCommand(client),
		newFaultfsSetCommand(client),
		newFaultfsClearCommand(client),
		newFaultfsStatsCommand(client),
		newFaultfsSyncCommand(client),
	)
	return cmd
}

func newFaultfsMountCommand(control *string) *cobra.Command {
	var backing, mountpoint string
	var opts faultfs.Options
	cmd := &cobra.Command{
		Use:   "mount",
		Short: "Mount faultfs in the foreground; SIGINT or SIGTERM unmounts",
		Long: `Mount a faultfs at --mountpoint passing through to --backing, and serve the
control API on --control until SIGINT or SIGTERM, then unmount (a clean
shutdown: the backing directory keeps what it holds). --mountpoint may equal
--backing, mounting over the data in place. Everything in --backing at mount
time counts as durable.`,
		Example: `  tidal-chaos faultfs mount --backing /tmp/node1.disk --mountpoint /tmp/node1
  tidal-chaos faultfs mount --backing /srv/data --mountpoint /srv/data --control unix:/run/faultfs.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if opts.Debug {
				opts.Logger = log.New(os.Stderr, "", log.LstdFlags)
			}
			l, err := faultfs.Listen(*control)
			if err != nil {
				return fmt.Errorf("--control: %w", err)
			}
			f, err := faultfs.Mount(backing, mountpoint, opts)
			if err != nil {
				l.Close()
				return err
			}
			srv := &http.Server{Handler: f.Handler(), ReadHeaderTimeout: 10 * time.Second}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(l) }()
			fmt.Fprintf(cmd.OutOrStdout(), "faultfs: %s mounted on %s, control on %s\n", f.Backing(), f.Mountpoint(), *control)
			var serveErr error
			select {
			case <-ctx.Done():
			case serveErr = <-served:
			}
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx)
			err = f.Unmount()
			if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
				err = errors.Join(fmt.Errorf("control API: %w", serveErr), err)
			}
			if err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "faultfs: unmounted %s\n", f.Mountpoint())
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&backing, "backing", "", "directory that holds the data (required)")
	f.StringVar(&mountpoint, "mountpoint", "", "where to mount (created if missing; may equal --backing) (required)")
	f.BoolVar(&opts.SkipBackingSync, "skip-backing-sync", false, "record fsyncs without syncing the backing disk (faster; hides real sync cost)")
	f.BoolVar(&opts.AllowOther, "allow-other", false, "let other users use the mount (the kernel checks permissions)")
	f.BoolVar(&opts.Debug, "debug", false, "log every FUSE request to stderr")
	_ = cmd.MarkFlagRequired("backing")
	_ = cmd.MarkFlagRequired("mountpoint")
	return cmd
}

func newFaultfsPowerCutCommand(client func() *faultfs.Client) *cobra.Command {
	var o faultfs.PowerCutOptions
	cmd := &cobra.Command{
		Use:   "power-cut",
		Short: "Lose everything not durable, then remount (kill -9 the program first)",
		Long: `Roll the backing directory back to its durable state: unsynced writes,
truncates, creates, renames and unlinks are undone, and the mount is replaced
by a fresh one (descriptors opened before fail with EIO). With --torn-writes
each file keeps a seeded random prefix of its unsynced writes, the last one
possibly cut at a 512-byte sector. Prints what was discarded.`,
		Example: `  tidal-chaos faultfs power-cut
  tidal-chaos faultfs power-cut --torn-writes --seed 7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := client().PowerCut(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printJSON(cmd, rep)
		},
	}
	cmd.Flags().BoolVar(&o.TornWrites, "torn-writes", false, "keep a random prefix of each file's unsynced writes")
	cmd.Flags().Int64Var(&o.Seed, "seed", 0, "seed for --torn-writes (0: from the clock; the report gives it)")
	return cmd
}

func newFaultfsSetCommand(client func() *faultfs.Client) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set KIND",
		Short: "Arm a fault: fsync-error, disk-full, slow-disk or corrupt-read",
		Long: `Arm one kind of fault, replacing an armed fault of the same kind; the other
kinds stay. Prints every armed fault.`,
		Example: `  tidal-chaos faultfs set disk-full --free 0
  tidal-chaos faultfs set fsync-error --after 100 --sticky`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	arm := func(cmd *cobra.Command, f faultfs.Faults) error {
		armed, err := client().Set(cmd.Context(), f)
		if err != nil {
			return err
		}
		return printJSON(cmd, armed)
	}

	var fe faultfs.FsyncError
	fsyncErr := &cobra.Command{
		Use:   "fsync-error",
		Short: "Fail fsync/fdatasync with EIO, the way Linux reports a lost write-back",
		Long: `The failing fsync returns EIO and drops the file's unsynced writes (reads
then return the durable bytes); other descriptors open on the file get EIO
once on their next fsync; later fsyncs succeed and the data stays lost. By
default one fsync fails and the fault is spent; --sticky fails every
matching fsync until cleared. --path is a glob over the path in the mount
(without "/", it matches the base name).`,
		Example: `  tidal-chaos faultfs set fsync-error --path 'wal/*.wal'
  tidal-chaos faultfs set fsync-error --after 100 --sticky
  tidal-chaos faultfs set fsync-error --dirs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return arm(cmd, faultfs.Faults{FsyncError: &fe}) },
	}
	fsyncErr.Flags().StringVar(&fe.Path, "path", "", "glob of files to fail (empty: every file)")
	fsyncErr.Flags().IntVar(&fe.After, "after", 0, "let this many matching fsyncs succeed first")
	fsyncErr.Flags().BoolVar(&fe.Sticky, "sticky", false, "fail every matching fsync until cleared")
	fsyncErr.Flags().BoolVar(&fe.Dirs, "dirs", false, "fail fsync of matching directories too")

	var free string
	var countOverwrites bool
	diskFull := &cobra.Command{
		Use:   "disk-full",
		Short: "ENOSPC once files have grown by --free bytes",
		Long: `Writes and fallocate that grow files use up --free; a write that does not
fit is cut short, then ENOSPC; creating entries fails once nothing is left.
Overwrites inside a file (preallocated space) still succeed, unless
--count-overwrites charges every byte written (as a copy-on-write
filesystem does): then the next --free bytes written anywhere are all there
is. Truncates and removing files give space back.`,
		Example: `  tidal-chaos faultfs set disk-full --free 0
  tidal-chaos faultfs set disk-full --free 64MiB
  tidal-chaos faultfs set disk-full --free 0 --count-overwrites`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseBytes(free)
			if err != nil {
				return fmt.Errorf("--free: %w", err)
			}
			return arm(cmd, faultfs.Faults{DiskFull: &faultfs.DiskFull{FreeBytes: n, CountOverwrites: countOverwrites}})
		},
	}
	diskFull.Flags().StringVar(&free, "free", "0", "space left: bytes, or with KiB, MiB, GiB")
	diskFull.Flags().BoolVar(&countOverwrites, "count-overwrites", false, "charge every byte written, overwrites of preallocated space included")

	var ops []string
	var sd faultfs.SlowDisk
	slow := &cobra.Command{
		Use:   "slow-disk",
		Short: "Delay operations, or stall them until cleared",
		Long: `--latency delays each operation of the chosen classes; --stall holds them
until the fault is cleared (or for at most --max-stall). Clearing releases
every held operation at once; a power cut fails them.`,
		Example: `  tidal-chaos faultfs set slow-disk --ops fsync --latency 200ms
  tidal-chaos faultfs set slow-disk --ops write,fsync --stall
  tidal-chaos faultfs set slow-disk --ops fsync --stall --max-stall 5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sd.Ops = nil
			for _, o := range ops {
				op, err := faultfs.ParseOp(strings.TrimSpace(o))
				if err != nil {
					return fmt.Errorf("--ops: %w", err)
				}
				sd.Ops = append(sd.Ops, op)
			}
			return arm(cmd, faultfs.Faults{SlowDisk: []faultfs.SlowDisk{sd}})
		},
	}
	slow.Flags().StringSliceVar(&ops, "ops", nil, fmt.Sprintf("operation classes to slow, comma-separated (empty: all): %v", faultfs.Ops))
	slow.Flags().DurationVar(&sd.Latency, "latency", 0, "added latency per operation")
	slow.Flags().BoolVar(&sd.Stall, "stall", false, "hold the operations until the fault is cleared (or a power cut)")
	slow.Flags().DurationVar(&sd.MaxStall, "max-stall", 0, "with --stall: release a held operation after this long (0: only when cleared)")

	var cr faultfs.CorruptRead
	var mask string
	corrupt := &cobra.Command{
		Use:   "corrupt-read",
		Short: "Flip bits in what reads of a file range return (the disk is untouched)",
		Example: `  tidal-chaos faultfs set corrupt-read --path 'wal/*.wal' --offset 4096 --length 512
  tidal-chaos faultfs set corrupt-read --path snapshot --mask 0x80`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := strconv.ParseUint(mask, 0, 8)
			if err != nil {
				return fmt.Errorf("--mask: expected a byte such as 0x01, found %q", mask)
			}
			cr.Mask = byte(m)
			return arm(cmd, faultfs.Faults{CorruptRead: []faultfs.CorruptRead{cr}})
		},
	}
	corrupt.Flags().StringVar(&cr.Path, "path", "", "glob of files to corrupt (empty: every file)")
	corrupt.Flags().Int64Var(&cr.Offset, "offset", 0, "first corrupted byte")
	corrupt.Flags().Int64Var(&cr.Length, "length", 0, "corrupted bytes (0: to the end of the file)")
	corrupt.Flags().StringVar(&mask, "mask", "0x01", "XORed into every byte of the range")

	cmd.AddCommand(fsyncErr, diskFull, slow, corrupt)
	return cmd
}

func newFaultfsClearCommand(client func() *faultfs.Client) *cobra.Command {
	return &cobra.Command{
		Use:   "clear [KIND...]",
		Short: "Disarm faults: the kinds given, or all",
		Example: `  tidal-chaos faultfs clear
  tidal-chaos faultfs clear slow-disk fsync-error`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var kinds []faultfs.Kind
			for _, a := range args {
				k, err := faultfs.ParseKind(a)
				if err != nil {
					return err
				}
				kinds = append(kinds, k)
			}
			armed, err := client().Clear(cmd.Context(), kinds...)
			if err != nil {
				return err
			}
			return printJSON(cmd, armed)
		},
	}
}

func newFaultfsStatsCommand(client func() *faultfs.Client) *cobra.Command {
	return &cobra.Command{
		Use:     "stats",
		Short:   "Print the mount's counters (operations, injected faults, unsynced state, last power cut) as JSON",
		Example: `  tidal-chaos faultfs stats`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := client().Stats(cmd.Context())
			if err != nil {
				return err
			}
			return printJSON(cmd, st)
		},
	}
}

func newFaultfsSyncCommand(client func() *faultfs.Client) *cobra.Command {
	return &cobra.Command{
		Use:     "sync",
		Short:   "Make everything durable, as syncfs(2) would (FUSE never sees syncfs)",
		Example: `  tidal-chaos faultfs sync`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return client().Sync(cmd.Context())
		},
	}
}

func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseBytes reads a byte count: a number, optionally with KiB, MiB or
// GiB.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	num := strings.TrimSpace(s)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if v, ok := strings.CutSuffix(num, suffix); ok {
			num, mult = strings.TrimSpace(v), m
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("expected a byte count such as 1048576 or 64MiB, found %q", s)
	}
	return n * mult, nil
}
