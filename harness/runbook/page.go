// Package runbook executes operator runbooks — the markdown pages under
// runbooks/ — against a live local cluster while a workload records a
// history, then judges the run with the chaos harness's checkers and with
// the availability budget the page states for itself. A runbook that stops
// working fails the build; the same page works typed by hand.
//
// A page (see runbooks/README.md for the contract) has a title, the
// sections When to use, Symptoms, Steps, Verify, Roll back and What can be
// lost, and one line
//
//	Availability budget: writes unavailable ≤ 3s at any moment
//
// Its ```sh blocks under Symptoms, Steps and Verify are executed in page
// order, each by a fresh `bash -euo pipefail` that has sourced the
// cluster's env.sh (runbooks/local-cluster.sh) and the lowercase variables
// earlier blocks set, so a page reads like one shell session. A block
// fenced ```sh manual is shown to people and never executed (the suite
// reports it); Roll back and the other sections may hold only those.
package runbook

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Section names every page must have, in the order people read them.
var Sections = []string{"When to use", "Symptoms", "Steps", "Verify", "Roll back", "What can be lost"}

// executedSections hold the blocks the suite runs; blocks elsewhere must
// be marked manual, so that nothing under Roll back ever runs by accident.
var executedSections = map[string]bool{"Symptoms": true, "Steps": true, "Verify": true}

// Page is one parsed runbook.
type Page struct {
	// Path is the file the page came from (as given to ParseFile); Name
	// is its base name without .md ("rolling-restart").
	Path, Name string
	Title      string
	// Budget is the longest time writes may be unavailable at any moment
	// while the runbook is followed under load.
	Budget     time.Duration
	BudgetLine int
	// Sections maps each section name to the line of its heading.
	Sections map[string]int
	// Blocks are every ```sh block in page order, manual ones included.
	Blocks []Block
}

// Block is one fenced shell block.
type Block struct {
	// Section is the ## section it is in; Heading the nearest heading
	// above it (the section itself when the block has none of its own).
	Section, Heading string
	// Line is the page line of the first line of code (after the fence).
	Line int
	Code string
	// Manual blocks (```sh manual) are for people only.
	Manual bool
}

// Label names the block for messages: "Steps › 2. Stop the node (line 41)".
func (b Block) Label() string {
	if b.Heading == b.Section {
		return fmt.Sprintf("%s (line %d)", b.Section, b.Line)
	}
	return fmt.Sprintf("%s › %s (line %d)", b.Section, b.Heading, b.Line)
}

// Executed returns the blocks the suite runs, in order.
func (p *Page) Executed() []Block {
	var out []Block
	for _, b := range p.Blocks {
		if !b.Manual {
			out = append(out, b)
		}
	}
	return out
}

// Manual returns the blocks shown to people only.
func (p *Page) Manual() []Block {
	var out []Block
	for _, b := range p.Blocks {
		if b.Manual {
			out = append(out, b)
		}
	}
	return out
}

// ParseError is one problem with a page, at a line (0: the page as a whole).
type ParseError struct {
	Path string
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.Path, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
}

// ParseFile reads and parses one page.
func ParseFile(path string) (*Page, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, src)
}

var (
	// budgetLead finds the line that means to state the budget, however
	// it is decorated ("**Availability budget:**", "- Availability budget").
	budgetLead = regexp.MustCompile(`(?i)^(?:[-*+]\s+)?[*_]*availability budget[*_]*\s*:?\s*[*_]*\s*(.*)$`)
	budgetBody = regexp.MustCompile(`(?i)^writes unavailable\s*(?:≤|<=)\s*(\S+?)\s+at any moment\.?$`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	fence      = regexp.MustCompile("^( {0,3})(```+|~~~+)\\s*(.*)$")
)

// Parse parses a page. Every problem found is reported, each with its
// line, joined into one error.
func Parse(path string, src []byte) (*Page, error) {
	p := &Page{Path: path, Name: strings.TrimSuffix(filepath.Base(path), ".md"), Sections: map[string]int{}}
	var errs []error
	bad := func(line int, format string, args ...any) {
		errs = append(errs, &ParseError{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
	}

	var (
		section, head string
		open          *Block // the block being read, if any
		openFence     string // the fence that opened it
		openIndent    int
		openLine      int
		code          []string
		inOther       bool // inside a fence that is not a shell block
	)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		if open != nil || inOther {
			if m := fence.FindStringSubmatch(line); m != nil && strings.HasPrefix(m[2], openFence[:1]) && len(m[2]) >= len(openFence) && m[3] == "" {
				if open != nil {
					open.Code = strings.Join(code, "\n") + "\n"
					if strings.TrimSpace(open.Code) == "" {
						bad(openLine, "empty ```sh block")
					}
					p.Blocks = append(p.Blocks, *open)
				}
				open, inOther, code = nil, false, nil
				continue
			}
			if open != nil {
				code = append(code, dedent(line, openIndent))
			}
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			info := strings.Fields(m[3])
			openFence, openIndent, openLine = m[2], len(m[1]), n
			if len(info) == 0 || (info[0] != "sh" && info[0] != "bash") {
				inOther = true
				continue
			}
			manual := false
			for _, w := range info[1:] {
				if w == "manual" {
					manual = true
				} else {
					bad(n, "```%s block: unknown word %q after the language (only \"manual\" is understood)", info[0], w)
				}
			}
			if section == "" {
				bad(n, "```%s block outside any section: put it under one of %s", info[0], strings.Join(Sections, ", "))
			} else if !manual && !executedSections[section] {
				bad(n, "```%s block under %q would be executed by the suite; only Symptoms, Steps and Verify blocks are — mark it ```%s manual", info[0], section, info[0])
			}
			open = &Block{Section: section, Heading: head, Line: n + 1, Manual: manual}
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			level, text := len(m[1]), m[2]
			switch {
			case level == 1:
				if p.Title != "" {
					bad(n, "a second title %q (the page's title is %q)", text, p.Title)
				}
				p.Title = text
			case level == 2:
				section, head = "", text
				for _, s := range Sections {
					if strings.EqualFold(text, s) {
						section, head = s, s
					}
				}
				if section == "" {
					bad(n, "unknown section %q: expected one of %s", text, strings.Join(Sections, ", "))
					section = text
					break
				}
				if first, dup := p.Sections[section]; dup {
					bad(n, "section %q again (first at line %d)", section, first)
				}
				p.Sections[section] = n
			default:
				head = text
			}
			continue
		}
		plain := strings.TrimSpace(line)
		if m := budgetLead.FindStringSubmatch(plain); m != nil {
			body := strings.TrimSpace(strings.Trim(m[1], "*_ "))
			if p.BudgetLine != 0 {
				bad(n, "a second availability budget (the first is at line %d)", p.BudgetLine)
				continue
			}
			p.BudgetLine = n
			bm := budgetBody.FindStringSubmatch(body)
			if bm == nil {
				bad(n, "availability budget: expected \"writes unavailable ≤ <duration> at any moment\", found %q", body)
				continue
			}
			d, err := time.ParseDuration(bm[1])
			if err != nil || d <= 0 {
				bad(n, "availability budget: expected a positive duration like 3s or 500ms, found %q", bm[1])
				continue
			}
			p.Budget = d
		}
	}
	if err := sc.Err(); err != nil {
		bad(n, "reading: %v", err)
	}
	if open != nil || inOther {
		bad(openLine, "fenced block opened here is never closed")
	}
	if p.Title == "" {
		bad(0, "no title: expected a first line like \"# Rolling restart\"")
	}
	for _, s := range Sections {
		if _, ok := p.Sections[s]; !ok {
			bad(0, "no %q section (every page has %s)", s, strings.Join(Sections, ", "))
		}
	}
	if p.BudgetLine == 0 {
		bad(0, "no availability budget: expected a line \"Availability budget: writes unavailable ≤ 3s at any moment\"")
	}
	if len(errs) == 0 && len(p.Executed()) == 0 {
		bad(0, "no ```sh block to execute under Symptoms, Steps or Verify")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// dedent removes up to n leading spaces (a fence indented inside a list
// indents its code the same way).
func dedent(line string, n int) string {
	for i := 0; i < n && strings.HasPrefix(line, " "); i++ {
		line = line[1:]
	}
	return line
}

// ParseDir parses every *.md page in dir except README.md, in name order.
func ParseDir(dir string) ([]*Page, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return nil, err
	}
	var pages []*Page
	var errs []error
	for _, path := range paths {
		if filepath.Base(path) == "README.md" {
			continue
		}
		p, err := ParseFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pages = append(pages, p)
	}
	return pages, errors.Join(errs...)
}
