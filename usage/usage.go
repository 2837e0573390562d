// Package usage gives every tidal command one exit status for a command
// line it cannot make sense of, so that a script or CI step can tell "you
// called me wrong" from each binary's own outcomes (tidal-server's failed
// start, tidal-chaos' INVALID verdict, tidal-stress' missed SLO).
//
// Invariant: Code is used by no binary for anything else. It is sysexits'
// EX_USAGE, which no tidal outcome (0–5) comes near.
package usage

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// Code is the exit status of a usage error in every tidal binary.
const Code = 64

// Error marks err as a usage error: a flag, argument or subcommand the
// command cannot take.
type Error struct{ Err error }

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns a usage Error with a formatted message.
func Errorf(format string, a ...any) error {
	return &Error{Err: fmt.Errorf(format, a...)}
}

// Is reports whether err is (or wraps) a usage Error.
func Is(err error) bool {
	var ue *Error
	return errors.As(err, &ue)
}

// Install marks the usage errors cobra itself finds under root: a flag it
// cannot parse (unknown, malformed value), a wrong number of positional
// arguments, and an unknown subcommand at any level. A parent command
// that runs nothing itself prints its help when called bare, as cobra
// does. Call it once the command tree is complete.
func Install(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &Error{Err: err}
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return &Error{Err: err}
				}
				return nil
			}
		} else if c.HasSubCommands() {
			// cobra's own check of a word after a command with
			// subcommands returns a plain error from its command lookup,
			// and none at all below the root, where a non-runnable parent
			// printed its help and exited 0; checked here, an unknown
			// subcommand is a usage error at every level.
			c.Args = func(cmd *cobra.Command, a []string) error {
				if len(a) > 0 {
					return &Error{Err: fmt.Errorf("unknown command %q for %q", a[0], cmd.CommandPath())}
				}
				return nil
			}
			if !c.Runnable() {
				c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
