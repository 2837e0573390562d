// Command tidal-images builds the tidal-server and tcp-relay images FROM
// scratch around static binaries, with only a Docker daemon (the legacy
// builder: no BuildKit, no buildx, nothing pulled). `make images` runs it.
// The recipe is harness/container's, the same one the container backend
// builds on demand, so an image from either is found by the other.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidaldb/tidal/harness/container"
)

func main() {
	var version, server, relay string
	var printDockerfile bool
	cmd := &cobra.Command{
		Use:   "tidal-images",
		Short: "Build the tidal-server and tcp-relay images FROM scratch around static binaries",
		Long: `Build tidal-server:<version>, tidal-server:dev and tcp-relay:<version>,
tcp-relay:dev from static binaries (CGO_ENABLED=0, as make build makes them).
Each image is also tagged bin-<hash of its build context>: building the same
binary again only adds the tags, and the harness's container backend finds it.

The images run as uid 65532, hold nothing but the binary, /etc/passwd and
/etc/group, and tidal-server's declares the volume /data.`,
		Example:      "  tidal-images --version v0.3.0 --server bin/tidal-server --relay bin/tcp-relay",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if printDockerfile {
				fmt.Fprintf(out, "# tidal-server\n%s\n# tcp-relay\n%s", container.ServerImage.Dockerfile(), container.RelayImage.Dockerfile())
				return nil
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			cli, err := container.Connect(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			tags := []string{container.VersionTag(version)}
			if tags[0] != "dev" {
				tags = append(tags, "dev")
			}
			for _, b := range []struct {
				im   container.Image
				path string
			}{{container.ServerImage, server}, {container.RelayImage, relay}} {
				ref, err := b.im.Build(ctx, cli, b.path, tags...)
				if err != nil {
					return fmt.Errorf("%s: %w", b.im.Repository, err)
				}
				fmt.Fprintf(out, "%s", ref)
				for _, t := range tags {
					fmt.Fprintf(out, " %s", b.im.Ref(t))
				}
				fmt.Fprintln(out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&version, "version", "dev", "version tag (e.g. `git describe` output; invalid characters become -)")
	f.StringVar(&server, "server", "bin/tidal-server", "static tidal-server binary")
	f.StringVar(&relay, "relay", "bin/tcp-relay", "static tcp-relay binary")
	f.BoolVar(&printDockerfile, "print-dockerfile", false, "print the two Dockerfiles and build nothing")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tidal-images:", err)
		os.Exit(1)
	}
}
