//go:build !tidalbugs

package server

import "github.com/tidaldb/tidal/tidal-server/ledger"

// plantedState holds what the planted defects of a tidalbugs build need
// (bugs_on.go); in a normal build it is empty and its hooks are no-ops
// the compiler inlines away.
type plantedState struct{}

func (s *StateMachine) noteRestart(string) {}

func (s *StateMachine) plantedRefold(_ uint64, events []ledger.Event) []ledger.Event { return events }
