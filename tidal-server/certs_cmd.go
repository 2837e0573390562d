package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// certsFlags are shared by the certs subcommands that sign.
type certsFlags struct {
	dir       string
	caKey     string
	lifetime  time.Duration
	overwrite bool
}

func (c *certsFlags) register(cmd *cobra.Command, lifetime time.Duration) {
	f := cmd.Flags()
	f.StringVar(&c.dir, "certs-dir", "", "directory of the certificates (required)")
	f.StringVar(&c.caKey, "ca-key", "", "the CA key (default <certs-dir>/ca.key; keep it off the nodes)")
	f.DurationVar(&c.lifetime, "lifetime", lifetime, "how long the certificate is valid")
	f.BoolVar(&c.overwrite, "overwrite", false, "replace an existing key and certificate")
	cmd.MarkFlagRequired("certs-dir")
}

func (c *certsFlags) options() certs.CreateOptions {
	return certs.CreateOptions{CertsDir: c.dir, CAKey: c.caKey, Lifetime: c.lifetime, Overwrite: c.overwrite}
}

func newCertsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create and list the certificates of a secured cluster",
		Long: `Create and list certificates, in the manner of CockroachDB's "cockroach cert".
A node's --certs-dir holds ca.crt, node.crt and node.key; a client's holds
ca.crt and client.NAME.crt/key. Keys are ECDSA P-256, written with mode 0600.

The CA key can mint any member or admin: create it with --ca-key pointing
outside the certs directory (an operator's machine or a vault), pass the same
--ca-key to create-node and create-client, and never copy it to the nodes.

Identities are URI SANs: tidal://member/N in node.crt (the peer plane
trusts the member id, not the host name), tidal://client/NAME?role=ROLE in a
client certificate.`,
	}
	var caf, nodef, clientf certsFlags
	createCA := &cobra.Command{
		Use:   "create-ca",
		Short: "Create the cluster CA: ca.crt and its key",
		Long: `Create the CA key and certificate. If ca.crt exists (with --overwrite), the new
CA is written first and the old, unexpired CA certificates are kept after it,
so certificates they signed keep working while each node and client gets a
new one; then remove the old CA from ca.crt everywhere.`,
		Example: `  tidal-server certs create-ca --certs-dir certs --ca-key safe/ca.key`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			iss, err := certs.CreateCA(caf.options())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote %s and %s (CA valid until %s)\n", iss.CertPath, iss.KeyPath, day(iss.Cert.NotAfter))
			if len(iss.KeptCAs) > 0 {
				fmt.Fprintf(out, "kept %d previous CA certificate(s) in %s; remove them once every node and client certificate is reissued\n", len(iss.KeptCAs), iss.CertPath)
			}
			if caf.caKey == "" {
				fmt.Fprintf(out, "note: the CA key is in the certs directory; move it off the nodes and pass --ca-key when creating certificates\n")
			}
			return nil
		},
	}
	caf.register(createCA, certs.DefaultCALifetime)

	var id uint64
	var hosts []string
	createNode := &cobra.Command{
		Use:   "create-node",
		Short: "Create node.crt and node.key for member --id, valid for --host names and IPs",
		Long: `Create the certificate of one member: URI SAN tidal://member/ID, the given host
names and IP addresses (the client plane's HTTPS host name check uses them),
usable as TLS server and client (the peer plane is mutual TLS). Run once per
node, each into that node's own --certs-dir (with a copy of ca.crt).`,
		Example: `  tidal-server certs create-node --id 1 --host node1.example.com --host 10.0.0.1 \
    --certs-dir node1-certs --ca-key safe/ca.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			iss, err := certs.CreateNode(nodef.options(), id, hosts)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (member %d, hosts %s, valid until %s)\n",
				iss.CertPath, iss.KeyPath, id, strings.Join(hosts, ","), day(iss.Cert.NotAfter))
			return nil
		},
	}
	nodef.register(createNode, certs.DefaultNodeLifetime)
	createNode.Flags().Uint64Var(&id, "id", 0, "the member id (as given to run --id; required)")
	createNode.Flags().StringSliceVar(&hosts, "host", nil, "a host name or IP address the node is reached at (repeat, or comma-separate; required)")
	createNode.MarkFlagRequired("id")
	createNode.MarkFlagRequired("host")

	var roleName string
	createClient := &cobra.Command{
		Use:   "create-client NAME",
		Short: "Create client.NAME.crt and its key with --role reader, writer or admin",
		Long: `Create a client certificate: URI SAN tidal://client/NAME?role=ROLE. reader may
read (GET data routes, nearest queries); writer may also write signals and
embeddings; admin may also use /admin/* (members, leader transfer,
snapshots, backup). NAME is 1-64 characters of a-z 0-9 . _ -.`,
		Example: `  tidal-server certs create-client ops --role admin --certs-dir ops-certs --ca-key safe/ca.key`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := auth.ParseRole(roleName)
			if err != nil {
				return fmt.Errorf("--role: %w", err)
			}
			iss, err := certs.CreateClient(clientf.options(), args[0], role)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (client %s, role %s, valid until %s)\n",
				iss.CertPath, iss.KeyPath, args[0], role, day(iss.Cert.NotAfter))
			return nil
		},
	}
	clientf.register(createClient, certs.DefaultClientLifetime)
	createClient.Flags().StringVar(&roleName, "role", "", "reader, writer or admin (required)")
	createClient.MarkFlagRequired("role")

	var listDir string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the certificates of a certs directory with identity, role, expiry and problems",
		Long: `List ca.crt, node.crt and every client.NAME.crt with its identity, role, hosts
and expiry, and anything that would stop it working (expired, not signed by
ca.crt, key missing or not matching). Exit status 3 when any has a problem.`,
		Example: "  tidal-server certs list --certs-dir certs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			entries, err := certs.List(listDir, time.Now())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FILE\tKIND\tIDENTITY\tROLE\tHOSTS\tEXPIRES\tPROBLEMS")
			problems := 0
			for _, e := range entries {
				expires := "-"
				if !e.NotAfter.IsZero() {
					expires = day(e.NotAfter)
				}
				p := "-"
				if len(e.Problems) > 0 {
					problems++
					p = strings.Join(e.Problems, "; ")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.File, e.Kind, dash(e.Identity), dash(e.Role), dash(strings.Join(e.Hosts, ",")), expires, p)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(entries) == 0 {
				return &exitError{code: 3, err: fmt.Errorf("%s: no certificates", filepath.Clean(listDir))}
			}
			if problems > 0 {
				return &exitError{code: 3, err: fmt.Errorf("%d certificate(s) with problems", problems)}
			}
			return nil
		},
	}
	list.Flags().StringVar(&listDir, "certs-dir", "", "directory of the certificates (required)")
	list.MarkFlagRequired("certs-dir")

	cmd.AddCommand(createCA, createNode, createClient, list)
	return cmd
}

func day(t time.Time) string { return t.UTC().Format("2006-01-02") }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
