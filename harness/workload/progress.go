package workload

import (
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/tidaldb/tidal/harness/history"
)

// Counts are the ops of one kind so far.
type Counts struct {
	Invoked int64 `json:"invoked"`
	OK      int64 `json:"ok"`
	Fail    int64 `json:"fail"`
	Info    int64 `json:"info"`
}

// InFlight is how many invoked ops have not completed yet.
func (c Counts) InFlight() int64 { return c.Invoked - c.OK - c.Fail - c.Info }

func (c *Counts) add(o Counts) {
	c.Invoked += o.Invoked
	c.OK += o.OK
	c.Fail += o.Fail
	c.Info += o.Info
}

// Progress is a snapshot of a workload's counters.
type Progress struct {
	ByF map[string]Counts `json:"by_f"`
	// Shed counts open-loop ops that came due while every worker was
	// busy: load the generator could not offer, apart from server errors.
	Shed int64 `json:"shed"`
	// Processes is how many process ids have been handed out; each info
	// retires one.
	Processes int64 `json:"processes"`
}

// Total sums the counts over every f.
func (p Progress) Total() Counts {
	var t Counts
	for _, c := range p.ByF {
		t.add(c)
	}
	return t
}

// String is a one-line summary for a progress line, e.g.
// "ops 1200 ok 1150 fail 3 info 7 shed 0 (write 800/780/2/3, add ...)".
func (p Progress) String() string {
	t := p.Total()
	var b strings.Builder
	fmt.Fprintf(&b, "ops %d ok %d fail %d info %d", t.Invoked, t.OK, t.Fail, t.Info)
	if p.Shed > 0 {
		fmt.Fprintf(&b, " shed %d", p.Shed)
	}
	fs := make([]string, 0, len(p.ByF))
	for f, c := range p.ByF {
		if c.Invoked > 0 {
			fs = append(fs, f)
		}
	}
	sort.Strings(fs)
	if len(fs) > 1 {
		b.WriteString(" (")
		for i, f := range fs {
			c := p.ByF[f]
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %d ok %d", f, c.Invoked, c.OK)
		}
		b.WriteString(")")
	}
	return b.String()
}

// fs are the op names a workload can record; counters exist for each from
// the start, so recording never takes a lock.
var fs = [...]string{history.FWrite, history.FAdd, history.FRead, history.FPutEmbedding, history.FGetEmbedding}

type counters struct {
	invoked, ok, fail, info atomic.Int64
}

type progress struct {
	byF  [len(fs)]counters
	shed atomic.Int64
}

func (p *progress) of(f string) *counters {
	for i, name := range fs {
		if name == f {
			return &p.byF[i]
		}
	}
	panic("workload: no counters for op " + f) // every generator uses fs
}

func (p *progress) completed(f string, t history.Type) {
	c := p.of(f)
	switch t {
	case history.OK:
		c.ok.Add(1)
	case history.Fail:
		c.fail.Add(1)
	default:
		c.info.Add(1)
	}
}

func (p *progress) snapshot(processes int64) Progress {
	out := Progress{ByF: make(map[string]Counts, len(fs)), Shed: p.shed.Load(), Processes: processes}
	for i, f := range fs {
		c := &p.byF[i]
		// Completions are loaded before invokes, so a snapshot never shows
		// more completed than invoked.
		ok, fail, info := c.ok.Load(), c.fail.Load(), c.info.Load()
		out.ByF[f] = Counts{Invoked: c.invoked.Load(), OK: ok, Fail: fail, Info: info}
	}
	return out
}
