// Command tidal-server runs a tidal node and talks to running ones.
//
//	tidal-server                      # single node, 127.0.0.1:7070, ./tidal-data
//	tidal-server run --id 1 --peers 1=127.0.0.1:7101,2=...,3=... \
//	    --client-addr 127.0.0.1:7071 --peer-addr 127.0.0.1:7101 --data-dir n1
//	tidal-server status --addr 127.0.0.1:7071
//	tidal-server wal verify --data-dir n1
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		if isExpectedExit(err) {
			fmt.Fprintln(os.Stderr, "tidal-server:", err)
		} else {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(exitCode(err))
	}
}
