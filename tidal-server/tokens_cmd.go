package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/tidal-server/auth"
)

func newTokensCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tokens",
		Short: "Make bearer tokens for a node's tokens file",
		Long: `A node that reads a tokens file accepts "Authorization: Bearer SECRET" from
clients (tidal-server run --tokens FILE). FILE has one token per line,
"NAME ROLE sha256:HEX", where HEX is the SHA-256 of the secret: the file
never holds a secret. '#' starts a comment; blank lines are ignored. A
running node re-reads it on SIGHUP (a file that does not parse is reported
and the old tokens stay in use). Clients send the secret with --token-file
(tidal-server's admin commands, tidal-stress) or as Authorization: Bearer.`,
	}
	var file, roleName string
	var fromStdin bool
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Append a token for NAME to --file and print its secret once",
		Long: `Generate a secret (32 random bytes, base64url), append "NAME ROLE sha256:HEX"
to --file (created with mode 0600 if missing; replaced atomically) and print
the secret on standard output. It is not stored anywhere: hand it to the
client now. With --secret-stdin the secret is read from standard input
instead (at least 16 characters) and nothing is printed.`,
		Example: `  tidal-server tokens add ci-bot --role writer --file /etc/tidal/tokens
  kill -HUP $(pidof tidal-server)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := auth.ParseRole(roleName)
			if err != nil {
				return fmt.Errorf("--role: %w", err)
			}
			secret := auth.NewSecret()
			if fromStdin {
				if secret, err = readSecret(cmd.InOrStdin()); err != nil {
					return err
				}
			}
			tok, err := auth.AppendToken(file, args[0], role, secret)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "added %s (%s) on line %d of %s; send the node SIGHUP to load it\n", tok.Name, tok.Role, tok.Line, file)
			if !fromStdin {
				fmt.Fprintln(cmd.OutOrStdout(), secret)
			}
			return nil
		},
	}
	add.Flags().StringVar(&file, "file", "", "the tokens file (required)")
	add.Flags().StringVar(&roleName, "role", "", "reader, writer or admin (required)")
	add.Flags().BoolVar(&fromStdin, "secret-stdin", false, "read the secret from standard input instead of generating one")
	add.MarkFlagRequired("file")
	add.MarkFlagRequired("role")

	hash := &cobra.Command{
		Use:   "hash",
		Short: "Print the sha256:HEX of a secret read from standard input",
		Long: `Read one secret from standard input (the first line; at least 16
characters) and print the hash a tokens file line stores for it, to write
the file by other means (configuration management).`,
		Example: `  printf '%s' "$SECRET" | tidal-server tokens hash`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			secret, err := readSecret(cmd.InOrStdin())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), auth.HashSecret(secret))
			return nil
		},
	}
	cmd.AddCommand(add, hash)
	return cmd
}

// readSecret reads the first line of r as a secret, without its line
// ending.
func readSecret(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", err
	}
	secret := strings.TrimRight(line, "\r\n")
	if secret == "" {
		return "", errors.New("secret: expected one on standard input, found none")
	}
	if err := auth.CheckSecret(secret); err != nil {
		return "", err
	}
	return secret, nil
}
