// Package procstart identifies a process across pid reuse by the moment
// the kernel started it.
//
// The harness labels what a run owns (pid files, containers) with its
// owner's pid and start time, and later judges the owner alive only when
// that pid still runs and started at the same moment. The start time must
// therefore read the same in every process and at every call. gopsutil's
// CreateTime does not guarantee that: inside a container (as CI machines
// and this project's own machines are) it derives the boot time from
// /proc/uptime and the wall clock, truncated to whole seconds, so two
// readers can differ by a second and a live run is judged gone — and its
// nodes killed or its containers removed by another run's reaper. The
// kernel's own record, field 22 of /proc/<pid>/stat (clock ticks after
// boot), has no such jitter.
package procstart

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procRoot is where the proc filesystem is read; tests point it elsewhere.
var procRoot = "/proc"

// Of returns pid's start time in clock ticks after boot. Compare it only
// with other values from Of on the same host.
func Of(pid int) (int64, error) {
	data, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStat(data)
}

// parseStat reads field 22 (starttime) of a /proc/<pid>/stat line. The
// second field, the command name in parentheses, may itself contain
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(data []byte) (int64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, fmt.Errorf("proc stat %q: expected the command in parentheses", truncate(data))
	}
	fields := bytes.Fields(data[end+1:])
	// After the command come state (field 3) ... starttime (field 22).
	const starttime = 22 - 3
	if len(fields) <= starttime {
		return 0, fmt.Errorf("proc stat %q: expected at least 22 fields, found %d", truncate(data), len(fields)+2)
	}
	v, err := strconv.ParseInt(string(fields[starttime]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat: field 22 (starttime): expected clock ticks, found %q", fields[starttime])
	}
	return v, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}
