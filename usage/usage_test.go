package usage

import (
	"errors"
	"io"
	"testing"

	"github.com/spf13/cobra"
)

func tree() *cobra.Command {
	root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }, SilenceErrors: true, SilenceUsage: true}
	root.Flags().Int("n", 0, "a number")
	sub := &cobra.Command{Use: "sub ARG", Args: cobra.ExactArgs(1), RunE: func(*cobra.Command, []string) error { return errors.New("failed while running") }}
	root.AddCommand(sub)
	group := &cobra.Command{Use: "group"}
	group.AddCommand(&cobra.Command{Use: "leaf", RunE: func(*cobra.Command, []string) error { return nil }})
	root.AddCommand(group)
	Install(root)
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	return root
}

// Every way cobra refuses a command line is a usage Error; an error of
// the command's own work is not.
func TestInstallMarksWhatCobraRefuses(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage bool
	}{
		{[]string{"--bogus"}, true},
		{[]string{"--n", "abc"}, true},
		{[]string{"nosuchcommand"}, true},
		{[]string{"sub"}, true},
		{[]string{"sub", "a", "b"}, true},
		{[]string{"sub", "--bogus", "a"}, true},
		{[]string{"group", "nosuchleaf"}, true},
		{[]string{"sub", "a"}, false},
	} {
		root := tree()
		root.SetArgs(tc.args)
		err := root.Execute()
		if err == nil {
			t.Fatalf("%q: expected an error, got none", tc.args)
		}
		if Is(err) != tc.usage {
			t.Errorf("%q: usage.Is(%v) = %v, expected %v", tc.args, err, Is(err), tc.usage)
		}
	}
	for _, args := range [][]string{{"--n", "3"}, {"group"}, {"group", "leaf"}, {"group", "leaf", "extra"}} {
		root := tree()
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Errorf("%q: a valid command line failed: %v", args, err)
		}
	}
}
