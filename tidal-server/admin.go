package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/client/creds"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/server"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// adminFlags are shared by the commands that talk to a running node.
type adminFlags struct {
	addr    string
	timeout time.Duration
	creds   creds.Flags
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.addr, "addr", "127.0.0.1:7070", "client address (HTTP API) of any node")
	cmd.Flags().DurationVar(&a.timeout, "timeout", 10*time.Second, "how long to wait for the node")
	// Admin commands present client.admin.crt unless told otherwise.
	a.creds.Register(cmd.Flags(), "admin")
}

// client returns a client for --addr with the credentials the flags give,
// the options (for other nodes of the same cluster), and the command's
// deadline.
func (a *adminFlags) client(cmd *cobra.Command) (*client.Client, []client.Option, context.Context, context.CancelFunc, error) {
	opts, err := a.creds.Options()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	return client.New(a.addr, opts...), opts, ctx, cancel, nil
}

func newStatusCommand() *cobra.Command {
	var a adminFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a node's view of the cluster: leader, term, indexes, members",
		Long: `Show what one node knows of the cluster. Match index, lag and reachability
per member are known only on the leader: asked on a follower, status fetches
them from the leader's client address; when the leader cannot be asked they
are shown as "-" (unknown), never as 0. --json prints the answering node's
raw /cluster/status.`,
		Example: "  tidal-server status --addr 127.0.0.1:7071\n  tidal-server status --addr 127.0.0.1:7071 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, opts, ctx, cancel, err := a.client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			progress, note := leaderProgress(ctx, st, opts)
			return printStatus(out, st, progress, note)
		},
	}
	a.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the raw /cluster/status JSON")
	return cmd
}

// leaderProgress returns a status that knows the members' replication
// progress: st itself on the leader, else the leader's own status fetched
// from its client address. nil, with a note saying why, when neither can.
func leaderProgress(ctx context.Context, st *client.Status, opts []client.Option) (*client.Status, string) {
	if st.KnowsProgress() {
		return st, ""
	}
	if st.Leader == 0 {
		return nil, "no leader known: match, lag and reachability are unknown (-)"
	}
	var addr string
	for _, m := range st.Members {
		if m.ID == st.Leader {
			addr = m.ClientAddr
		}
	}
	if addr == "" {
		return nil, fmt.Sprintf("leader %d's client address is not known: match, lag and reachability are unknown (-)", st.Leader)
	}
	lst, err := client.New(addr, append(opts, client.WithRetries(0))...).Status(ctx)
	if err != nil {
		return nil, fmt.Sprintf("leader %d at %s did not answer (%v): match, lag and reachability are unknown (-)", st.Leader, addr, err)
	}
	if !lst.KnowsProgress() {
		return nil, fmt.Sprintf("node %d at %s no longer leads: match, lag and reachability are unknown (-)", st.Leader, addr)
	}
	return lst, fmt.Sprintf("match, lag and reachability as leader %d at %s reports them", st.Leader, addr)
}

func printStatus(out io.Writer, st, progress *client.Status, note string) error {
	fmt.Fprintf(out, "node %d   leader %d   term %d   commit %d   applied %d\n", st.Node, st.Leader, st.Term, st.Commit, st.Applied)
	if st.Error != "" {
		fmt.Fprintf(out, "stopped: %s\n", st.Error)
	}
	if m := st.Memory; m != nil {
		bound := "off"
		if m.MaxMemory > 0 {
			bound = api.FormatBytes(m.MaxMemory)
		}
		ratio := "-"
		if m.VectorBytes > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(m.RSS)/float64(m.VectorBytes))
		}
		fmt.Fprintf(out, "memory   rss %s (%s of vectors)   go heap %s   vectors %s   index overhead %s   snapshots held %s   max-memory %s\n",
			api.FormatBytes(m.RSS), ratio, api.FormatBytes(m.GoHeap), api.FormatBytes(m.VectorBytes),
			api.FormatBytes(m.IndexOverhead), api.FormatBytes(m.SnapshotBytesHeld), bound)
	}
	if note != "" {
		fmt.Fprintln(out, note)
	}
	fmt.Fprintln(out)
	byID := map[uint64]client.MemberStatus{}
	if progress != nil {
		for _, m := range progress.Members {
			byID[m.ID] = m
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROLE\tPEER\tCLIENT\tMATCH\tLAG\tREACHABLE")
	for _, m := range st.Members {
		match, lag, reachable := "-", "-", "-"
		if p, ok := byID[m.ID]; ok {
			match, lag, reachable = strconv.FormatUint(p.Match, 10), strconv.FormatUint(p.Lag, 10), strconv.FormatBool(p.Reachable)
		}
		clientAddr := m.ClientAddr
		if clientAddr == "" {
			clientAddr = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Role, m.PeerAddr, clientAddr, match, lag, reachable)
	}
	return tw.Flush()
}

func newMembersCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "members", Short: "Add or remove cluster members"}
	var a adminFlags
	var m client.Member
	add := &cobra.Command{
		Use:   "add",
		Short: "Add a node (as a learner; promoted to voter once it has caught up)",
		Long: `Add a node to the cluster. It joins as a learner and the leader promotes it to
voter once its log is within 1000 entries of the commit index. Then start
the new node with --join and the full --peers list. Ids are never reused:
pick one no node ever had. --client-addr is recorded in the membership table
(status shows it; a voter that omits it publishes its own once it runs).`,
		Example: `  tidal-server members add --addr 127.0.0.1:7071 --id 4 --peer-addr 127.0.0.1:7104 --client-addr 127.0.0.1:7074`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if m.ID == 0 {
				return fmt.Errorf("--id: expected a node id > 0, found 0")
			}
			c, _, ctx, cancel, err := a.client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			got, err := c.AddMember(ctx, m)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added member %d (peer %s, client %s) as learner\n", got.ID, got.PeerAddr, got.ClientAddr)
			return nil
		},
	}
	a.register(add)
	add.Flags().Uint64Var(&m.ID, "id", 0, "new member's id, never used before (required)")
	add.Flags().StringVar(&m.PeerAddr, "peer-addr", "", "new member's peer address (required)")
	add.Flags().StringVar(&m.ClientAddr, "client-addr", "", "new member's client address")
	for _, name := range []string{"id", "peer-addr"} {
		if err := add.MarkFlagRequired(name); err != nil {
			panic(err) // a flag name typo: a programming error
		}
	}

	var ra adminFlags
	remove := &cobra.Command{
		Use:     "remove ID",
		Short:   "Remove a member; its id can never be used again",
		Example: "  tidal-server members remove 3 --addr 127.0.0.1:7071",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("ID: expected a node id > 0, found %q", args[0])
			}
			c, _, ctx, cancel, err := ra.client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.RemoveMember(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed member %d\n", id)
			return nil
		},
	}
	ra.register(remove)
	cmd.AddCommand(add, remove)
	return cmd
}

func newTransferLeaderCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{
		Use:     "transfer-leader ID",
		Short:   "Move leadership to member ID and wait until it leads",
		Example: "  tidal-server transfer-leader 2 --addr 127.0.0.1:7071",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("ID: expected a node id > 0, found %q", args[0])
			}
			c, _, ctx, cancel, err := a.client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			if err := c.TransferLeader(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "member %d is the leader\n", id)
			return nil
		},
	}
	a.register(cmd)
	return cmd
}

func newBackupCommand() *cobra.Command {
	var a adminFlags
	var out string
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Write a consistent copy of a node's state to a file",
		Long: `Stream the node's current state (ledger, embeddings, write-id memory) into a
CRC-protected file. Restore it with "tidal-server restore".`,
		Example: "  tidal-server backup --addr 127.0.0.1:7071 --out tidal.backup",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, ctx, cancel, err := a.client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			tmp := out + ".partial"
			f, err := os.Create(tmp)
			if err != nil {
				return err
			}
			n, err := c.Backup(ctx, f)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(tmp)
				return err
			}
			data, err := os.ReadFile(tmp)
			if err != nil {
				return err
			}
			if _, err := server.ReadBackup(data); err != nil {
				os.Remove(tmp)
				return fmt.Errorf("backup received but does not verify: %w", err)
			}
			if err := os.Rename(tmp, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d bytes, verified)\n", out, n)
			return nil
		},
	}
	a.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "file to write (required)")
	if err := cmd.MarkFlagRequired("out"); err != nil {
		panic(err)
	}
	return cmd
}

func newRestoreCommand() *cobra.Command {
	var from, dataDir, peerAddr, clientAddr string
	var id uint64
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Create a new single-node data dir from a backup file",
		Long: `Create a data dir for a new one-node cluster whose state is the backup's.
Start it with "tidal-server run" using the same --id, --peer-addr and
--data-dir, then add members with "tidal-server members add".`,
		Example: `  tidal-server restore --from tidal.backup --data-dir restored --id 1 --peer-addr 127.0.0.1:7100
  tidal-server run --data-dir restored --id 1 --peer-addr 127.0.0.1:7100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := os.ReadFile(from)
			if err != nil {
				return err
			}
			state, err := server.ReadBackup(data)
			if err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			index, err := server.StateIndex(state)
			if err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			if err := replica.RestoreDataDir(dataDir, replica.Member{ID: id, PeerAddr: peerAddr, ClientAddr: clientAddr}, index, state); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s at index %d as node %d\n", from, dataDir, index, id)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "backup file (required)")
	if err := cmd.MarkFlagRequired("from"); err != nil {
		panic(err)
	}
	f.StringVar(&dataDir, "data-dir", "tidal-data", "new data dir (must not hold a WAL)")
	f.Uint64Var(&id, "id", 1, "node id of the restored node")
	f.StringVar(&peerAddr, "peer-addr", "127.0.0.1:7100", "peer address of the restored node")
	f.StringVar(&clientAddr, "client-addr", "127.0.0.1:7070", "client address of the restored node")
	return cmd
}

func newRecoverCommand() *cobra.Command {
	var o server.RecoverOptions
	var force bool
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Make a stopped survivor of a lost quorum the only member of a new cluster (--force-new-cluster)",
		Long: `After a majority of the members is lost for good, make the most advanced
survivor (the highest last log index; --dry-run prints it) the only member of
a new cluster, keeping its whole log: its snapshot and every entry after it,
committed or not, applied in order — etcd's --force-new-cluster. Its member
id stays; every other old member is recorded as removed (if one comes back
it is told so and stops, exit status 5). The old wal/ and snap/ are moved
into <data-dir>/pre-recover-<time>/, not deleted.

What is lost: every write acknowledged at a log index above the survivor's
last log index (the first line prints it: last_index=...). Run it on a
stopped node only (it takes the WAL's lock); then start the node with
--peers <id>=<its peer address> and add members under new ids.
runbooks/force-new-cluster.md is the whole procedure.

Exit status: 0 done (or reported, with --dry-run); 1 refused or failed;
3 the WAL is damaged (wal verify; choose another survivor or repair).`,
		Example: `  tidal-server recover --force-new-cluster --dry-run --data-dir n3 --id 3
  tidal-server recover --force-new-cluster --data-dir n3 --id 3
  tidal-server run --id 3 --peers 3=127.0.0.1:7103 --data-dir n3 --peer-addr 127.0.0.1:7103 --client-addr 127.0.0.1:7073`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !force {
				return errors.New("recover: give --force-new-cluster (the only kind of recovery there is): it makes this data dir a new one-member cluster")
			}
			rep, err := server.RecoverForceNewCluster(o)
			var ce *wal.CorruptionError
			if errors.As(err, &ce) {
				return &exitError{code: exitDamage, err: err}
			}
			if err != nil {
				return err
			}
			rep.Write(cmd.OutOrStdout(), o.DataDir)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&force, "force-new-cluster", false, "make this data dir the only member of a new cluster, keeping its whole log (required)")
	f.BoolVar(&o.DryRun, "dry-run", false, "read the data dir and print what would be kept and lost; change nothing")
	f.StringVar(&o.DataDir, "data-dir", "tidal-data", "the stopped survivor's data dir")
	f.Uint64Var(&o.ID, "id", 0, "the survivor's member id (required)")
	f.StringVar(&o.PeerAddr, "peer-addr", "", "its peer address in the new cluster (default: the one the old membership has)")
	f.StringVar(&o.ClientAddr, "client-addr", "", "its client address (default: the one the old membership has)")
	f.StringVar(&o.SchemaPath, "schema", "", "the schema the cluster ran (--schema of run; default: the default schema)")
	f.IntVar(&o.IDsPerGeneration, "ids-per-generation", 500000, "the cluster's --ids-per-generation")
	if err := cmd.MarkFlagRequired("id"); err != nil {
		panic(err)
	}
	return cmd
}
