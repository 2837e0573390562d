package runbook

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// fakeCertsEnv makes this test binary act as `tidal-server certs ...` and
// `tidal-server tokens add ...` (the fake tidal-server of local_test.go
// hands those commands to it), so that local-cluster.sh's secured set-up
// runs on real certificates made by package certs without building the
// server. The flags are the real commands' flags local-cluster.sh uses.
const fakeCertsEnv = "RUNBOOK_TEST_FAKE_CERTS"

// mountEnv makes this test binary mount a faultfs ("BACKING MOUNTPOINT")
// and serve it until killed: a scenario's mount whose server died.
const mountEnv = "RUNBOOK_TEST_MOUNT"

func TestMain(m *testing.M) {
	if dirs := strings.Fields(os.Getenv(mountEnv)); len(dirs) == 2 {
		if _, err := faultfs.Mount(dirs[0], dirs[1], faultfs.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("mounted")
		select {}
	}
	if os.Getenv(fakeCertsEnv) == "1" {
		if err := fakeCertsCommand(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func fakeCertsCommand(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("fake tidal-server: expected a command and a subcommand, found %q", args)
	}
	fs := flag.NewFlagSet(args[0]+" "+args[1], flag.ContinueOnError)
	dir := fs.String("certs-dir", "", "")
	caKey := fs.String("ca-key", "", "")
	id := fs.Uint64("id", 0, "")
	host := fs.String("host", "", "")
	role := fs.String("role", "", "")
	file := fs.String("file", "", "")
	overwrite := fs.Bool("overwrite", false, "")
	rest := args[2:]
	var name string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	o := certs.CreateOptions{CertsDir: *dir, CAKey: *caKey, Overwrite: *overwrite}
	var err error
	switch args[0] + " " + args[1] {
	case "certs create-ca":
		_, err = certs.CreateCA(o)
	case "certs create-node":
		_, err = certs.CreateNode(o, *id, strings.Split(*host, ","))
	case "certs create-client":
		var r auth.Role
		if r, err = auth.ParseRole(*role); err == nil {
			_, err = certs.CreateClient(o, name, r)
		}
	case "tokens add":
		var r auth.Role
		if r, err = auth.ParseRole(*role); err == nil {
			secret := auth.NewSecret()
			if _, err = auth.AppendToken(*file, name, r, secret); err == nil {
				fmt.Println(secret)
			}
		}
	default:
		return fmt.Errorf("fake tidal-server: %q is not faked", args[:2])
	}
	return err
}
