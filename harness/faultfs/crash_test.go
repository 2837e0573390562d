package faultfs

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// step is one operation of a crash-test script. Each step opens what it
// needs and closes it again, as separate program runs would.
type step struct {
	op   string // create write truncate ftruncate fsync fdatasync fsyncdir fsync-eio rename link unlink mkdir rmdir cut
	path string
	to   string // rename, link
	off  int64
	data string
	size int64
}

func create(p string) step                     { return step{op: "create", path: p} }
func write(p string, off int64, d string) step { return step{op: "write", path: p, off: off, data: d} }
func truncate(p string, size int64) step       { return step{op: "truncate", path: p, size: size} }
func ftruncate(p string, size int64) step      { return step{op: "ftruncate", path: p, size: size} }
func fsync(p string) step                      { return step{op: "fsync", path: p} }
func fdatasync(p string) step                  { return step{op: "fdatasync", path: p} }
func fsyncDir(p string) step                   { return step{op: "fsyncdir", path: p} }
func fsyncEIO(p string) step                   { return step{op: "fsync-eio", path: p} }
func rename(from, to string) step              { return step{op: "rename", path: from, to: to} }
func link(from, to string) step                { return step{op: "link", path: from, to: to} }
func unlink(p string) step                     { return step{op: "unlink", path: p} }
func mkdir(p string) step                      { return step{op: "mkdir", path: p} }
func rmdir(p string) step                      { return step{op: "rmdir", path: p} }
func cut() step                                { return step{op: "cut"} }

func (s step) String() string {
	switch s.op {
	case "write":
		d := s.data
		if len(d) > 12 {
			d = fmt.Sprintf("%s...(%d bytes)", d[:12], len(d))
		}
		return fmt.Sprintf("write(%s, %d, %q)", s.path, s.off, d)
	case "truncate", "ftruncate":
		return fmt.Sprintf("%s(%s, %d)", s.op, s.path, s.size)
	case "rename", "link":
		return fmt.Sprintf("%s(%s, %s)", s.op, s.path, s.to)
	case "cut":
		return "power-cut"
	}
	return fmt.Sprintf("%s(%s)", s.op, s.path)
}

func scriptString(steps []step) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, s.String())
	}
	return strings.Join(parts, "; ")
}

// onModel applies s to the model.
func (s step) onModel(m *model) error {
	switch s.op {
	case "create":
		return m.create(s.path, false)
	case "mkdir":
		return m.create(s.path, true)
	case "write":
		return m.write(s.path, s.off, []byte(s.data))
	case "truncate", "ftruncate":
		return m.truncate(s.path, s.size)
	case "fsync", "fdatasync", "fsyncdir":
		return m.fsync(s.path)
	case "fsync-eio":
		return m.failFsync(s.path)
	case "rename":
		return m.rename(s.path, s.to)
	case "link":
		return m.link(s.path, s.to)
	case "unlink", "rmdir":
		return m.remove(s.path)
	}
	return fmt.Errorf("model: step %s not handled here", s)
}

// onMount applies s to the mount with plain system calls.
func (s step) onMount(f *FS, mnt string) error {
	p := filepath.Join(mnt, s.path)
	withFd := func(flags int, do func(fd int) error) error {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		err = do(fd)
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		return err
	}
	switch s.op {
	case "create":
		return withFd(unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, func(int) error { return nil })
	case "write":
		return withFd(unix.O_WRONLY, func(fd int) error {
			n, err := unix.Pwrite(fd, []byte(s.data), s.off)
			if err == nil && n != len(s.data) {
				err = fmt.Errorf("short write: %d of %d bytes", n, len(s.data))
			}
			return err
		})
	case "truncate":
		return unix.Truncate(p, s.size)
	case "ftruncate":
		return withFd(unix.O_WRONLY, func(fd int) error { return unix.Ftruncate(fd, s.size) })
	case "fsync":
		return withFd(unix.O_RDONLY, unix.Fsync)
	case "fdatasync":
		return withFd(unix.O_RDONLY, unix.Fdatasync)
	case "fsyncdir":
		return withFd(unix.O_RDONLY|unix.O_DIRECTORY, unix.Fsync)
	case "fsync-eio":
		// Every file: this is the only fsync while it is armed, and a glob
		// would see one name only of a file with hard links.
		if err := f.Set(Faults{FsyncError: &FsyncError{}}); err != nil {
			return err
		}
		defer f.Clear(KindFsyncError)
		err := withFd(unix.O_RDONLY, unix.Fsync)
		if !isErrno(err, syscall.EIO) {
			return fmt.Errorf("fsync with an fsync-error fault armed: want EIO, got %v", err)
		}
		return nil
	case "rename":
		return unix.Rename(p, filepath.Join(mnt, s.to))
	case "link":
		return unix.Link(p, filepath.Join(mnt, s.to))
	case "unlink":
		return unix.Unlink(p)
	case "mkdir":
		return unix.Mkdir(p, 0o755)
	case "rmdir":
		return unix.Rmdir(p)
	}
	return fmt.Errorf("step %s not handled here", s)
}

// crashRun runs scripts on one mount, resetting it between runs.
type crashRun struct {
	t   *testing.T
	f   *FS
	mnt string
}

func newCrashRun(t *testing.T) *crashRun {
	// Durability is modelled, not the backing disk's: skip its fsyncs.
	f, _, mnt := mountForTest(t, Options{SkipBackingSync: true})
	return &crashRun{t: t, f: f, mnt: mnt}
}

// reset empties the mount and makes the emptiness durable.
func (r *crashRun) reset() {
	r.t.Helper()
	ents, err := os.ReadDir(r.mnt)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(r.mnt, e.Name())); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := r.f.Sync(); err != nil {
		r.t.Fatal(err)
	}
}

// run runs setup (made durable by Sync), then script, on both the mount and
// a model, and returns the model. A cut step cuts power on both and checks
// the survivors.
func (r *crashRun) run(setup, script []step, label string) *model {
	r.t.Helper()
	r.reset()
	m := newModel()
	for _, s := range setup {
		if err := s.onMount(r.f, r.mnt); err != nil {
			r.t.Fatalf("%s: setup %s: %v", label, s, err)
		}
		if err := s.onModel(m); err != nil {
			r.t.Fatalf("%s: setup %s on the model: %v", label, s, err)
		}
	}
	if err := r.f.Sync(); err != nil {
		r.t.Fatal(err)
	}
	m.syncAll()
	for i, s := range script {
		if s.op == "cut" {
			m = r.cutAndCheck(m, PowerCutOptions{}, fmt.Sprintf("%s, power cut at step %d", label, i))
			continue
		}
		if err := s.onMount(r.f, r.mnt); err != nil {
			r.t.Fatalf("%s: step %d %s: %v\nscript: %s", label, i, s, err, scriptString(script))
		}
		if err := s.onModel(m); err != nil {
			r.t.Fatalf("%s: step %d %s on the model: %v", label, i, s, err)
		}
	}
	return m
}

// cutAndCheck cuts power and compares what survived with the model; it
// returns the model rebooted from what survived.
func (r *crashRun) cutAndCheck(m *model, o PowerCutOptions, label string) *model {
	r.t.Helper()
	if _, err := r.f.PowerCut(o); err != nil {
		r.t.Fatalf("%s: %v", label, err)
	}
	got, links := readTree(r.t, r.mnt)
	want := m.survivors()
	if d := diffTrees(want, got); d != "" {
		r.t.Errorf("%s: the surviving tree differs from the model:\n%s", label, d)
	}
	if d := diffLinks(want, links); d != "" {
		r.t.Errorf("%s: hard links differ from the model:\n%s", label, d)
	}
	for p, e := range got {
		w := want[p]
		w.data = e.data
		want[p] = w
	}
	return reboot(want)
}

// crashAtEveryStep runs every prefix of script after setup, cuts power and
// checks the survivors against the model.
func (r *crashRun) crashAtEveryStep(name string, setup, script []step) {
	r.t.Helper()
	for i := 0; i <= len(script); i++ {
		label := fmt.Sprintf("%s, crash after %d of %d steps [%s]", name, i, len(script), scriptString(script[:i]))
		m := r.run(setup, script[:i], label)
		r.cutAndCheck(m, PowerCutOptions{}, label)
	}
}

// dirMark stands for a directory in the expected trees below.
const dirMark = "<dir>"

func expectTree(t *testing.T, mnt, label string, want map[string]string) {
	t.Helper()
	got, _ := readTree(t, mnt)
	w := map[string]mEntry{}
	for p, d := range want {
		w[p] = mEntry{dir: d == dirMark, data: d}
		if d == dirMark {
			w[p] = mEntry{dir: true}
		}
	}
	if d := diffTrees(w, got); d != "" {
		t.Errorf("%s: after the power cut:\n%s", label, d)
	}
}

// TestPowerCutClassics pins the cases every storage engine must get right,
// with the expected survivors written out by hand (not taken from the
// model), then crashes each script at every step against the model.
func TestPowerCutClassics(t *testing.T) {
	cases := []struct {
		name          string
		setup, script []step
		want          map[string]string // after a cut at the end of script
	}{{
		name:   "create, write, fsync the file but not the directory: the file is gone",
		script: []step{create("a"), write("a", 0, "hello"), fsync("a")},
		want:   map[string]string{},
	}, {
		name:   "create, write, fsync file and directory: the file survives",
		script: []step{create("a"), write("a", 0, "hello"), fsync("a"), fsyncDir("")},
		want:   map[string]string{"a": "hello"},
	}, {
		name:   "a durable name whose data was never synced is empty",
		script: []step{create("a"), write("a", 0, "hello"), fsyncDir("")},
		want:   map[string]string{"a": ""},
	}, {
		name:   "rename over an existing file without a directory fsync: the old file is back",
		setup:  []step{create("b"), write("b", 0, "old")},
		script: []step{create("tmp"), write("tmp", 0, "new"), fsync("tmp"), rename("tmp", "b")},
		want:   map[string]string{"b": "old"},
	}, {
		name:   "rename over an existing file, then the directory fsync: the new file",
		setup:  []step{create("b"), write("b", 0, "old")},
		script: []step{create("tmp"), write("tmp", 0, "new"), fsync("tmp"), rename("tmp", "b"), fsyncDir("")},
		want:   map[string]string{"b": "new"},
	}, {
		name:   "unsynced truncate: the old size is back",
		setup:  []step{create("a"), write("a", 0, "0123456789")},
		script: []step{truncate("a", 3), ftruncate("a", 20)},
		want:   map[string]string{"a": "0123456789"},
	}, {
		name:   "synced truncate stays",
		setup:  []step{create("a"), write("a", 0, "0123456789")},
		script: []step{ftruncate("a", 3), fdatasync("a"), truncate("a", 1)},
		want:   map[string]string{"a": "012"},
	}, {
		name:   "write after fsync: only the synced prefix",
		setup:  []step{create("a")},
		script: []step{write("a", 0, "abc"), fsync("a"), write("a", 3, "def"), write("a", 1, "X")},
		want:   map[string]string{"a": "abc"},
	}, {
		name:   "unlink without a directory fsync: the file is back with its durable content",
		setup:  []step{create("a"), write("a", 0, "keep")},
		script: []step{write("a", 0, "lost"), unlink("a"), create("a"), write("a", 0, "other"), fsync("a")},
		want:   map[string]string{"a": "keep"},
	}, {
		name:   "a file in a new directory: durable only when both directories are synced",
		script: []step{mkdir("d"), create("d/x"), write("d/x", 0, "x"), fsync("d/x"), fsyncDir("d")},
		want:   map[string]string{},
	}, {
		name:   "a directory moved to another: durable where its new parent was synced",
		setup:  []step{mkdir("d"), mkdir("e"), create("d/x"), write("d/x", 0, "x")},
		script: []step{rename("d", "e/d"), fsyncDir("e")},
		want:   map[string]string{"e": dirMark, "e/d": dirMark, "e/d/x": "x"},
	}, {
		name:   "a file moved across directories with only the source synced: gone from both",
		setup:  []step{mkdir("d"), mkdir("e"), create("d/x"), write("d/x", 0, "x")},
		script: []step{rename("d/x", "e/x"), fsyncDir("d")},
		want:   map[string]string{"d": dirMark, "e": dirMark},
	}, {
		name:   "a file moved across directories with only the destination synced: at both names",
		setup:  []step{mkdir("d"), mkdir("e"), create("d/x"), write("d/x", 0, "x")},
		script: []step{rename("d/x", "e/x"), fsyncDir("e")},
		want:   map[string]string{"d": dirMark, "e": dirMark, "d/x": "x", "e/x": "x"},
	}, {
		name:   "rmdir without a directory fsync: the directory and its durable entries are back",
		setup:  []step{mkdir("d"), create("d/x"), write("d/x", 0, "x")},
		script: []step{unlink("d/x"), fsyncDir("d"), rmdir("d")},
		want:   map[string]string{"d": dirMark},
	}, {
		name:   "hard link, then the original removed: the link survives once synced",
		setup:  []step{create("a"), write("a", 0, "data")},
		script: []step{link("a", "b"), unlink("a"), fsyncDir("")},
		want:   map[string]string{"b": "data"},
	}, {
		name:   "failed fsync drops the unsynced data; a later fsync does not bring it back",
		setup:  []step{create("a"), write("a", 0, "durable")},
		script: []step{write("a", 0, "LOST!!!"), fsyncEIO("a"), fsync("a"), write("a", 7, "+more"), fsync("a")},
		want:   map[string]string{"a": "durable+more"},
	}, {
		name:   "power cut, work, power cut again",
		setup:  []step{create("a"), write("a", 0, "one")},
		script: []step{write("a", 0, "two"), cut(), write("a", 3, "!"), fsync("a"), create("b"), cut(), write("a", 0, "x")},
		want:   map[string]string{"a": "one!"},
	}}
	r := newCrashRun(t)
	for _, c := range cases {
		m := r.run(c.setup, c.script, c.name)
		if _, err := r.f.PowerCut(PowerCutOptions{}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		expectTree(t, r.mnt, c.name, c.want)
		if d := diffTrees(m.survivors(), func() map[string]mEntry { g, _ := readTree(t, r.mnt); return g }()); d != "" {
			t.Errorf("%s: the model disagrees with the hand-written expectation:\n%s", c.name, d)
		}
		r.crashAtEveryStep(c.name, c.setup, c.script)
	}
}

// randomScript generates a script of n valid steps over a small namespace
// (a, b, c files and d, e directories at the root; x, y in directories),
// checking validity against a model it runs along.
func randomScript(rng *rand.Rand, n int) (setup, script []step) {
	m := newModel()
	setup = []step{create("a"), write("a", 0, strings.Repeat("A", 700)), mkdir("d"), create("d/x"), write("d/x", 0, "dx")}
	for _, s := range setup {
		if err := s.onModel(m); err != nil {
			panic(err)
		}
	}
	m.syncAll() // as crashRun.run does
	dirs := func() []string {
		out := []string{""}
		for _, p := range []string{"d", "e", "d/e", "e/d"} {
			if m.isDir(p) {
				out = append(out, p)
			}
		}
		return out
	}
	files := func() []string {
		var out []string
		for _, d := range dirs() {
			for _, name := range []string{"a", "b", "c", "x", "y"} {
				p := joinRel(d, name)
				if m.exists(p) && !m.isDir(p) {
					out = append(out, p)
				}
			}
		}
		return out
	}
	freeFile := func() (string, bool) {
		var out []string
		for _, d := range dirs() {
			for _, name := range []string{"a", "b", "c", "x", "y"} {
				if p := joinRel(d, name); !m.exists(p) {
					out = append(out, p)
				}
			}
		}
		if len(out) == 0 {
			return "", false
		}
		return out[rng.IntN(len(out))], true
	}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	letters := "abcdefghijklmnopqrstuvwxyz"
	for len(script) < n {
		var s step
		fs := files()
		switch k := rng.IntN(100); {
		case k < 12:
			p, ok := freeFile()
			if !ok {
				continue
			}
			s = create(p)
		case k < 32:
			if len(fs) == 0 {
				continue
			}
			size := 1 + rng.IntN(1500)
			s = write(pick(fs), int64(rng.IntN(1200)), strings.Repeat(string(letters[rng.IntN(26)]), size))
		case k < 38:
			if len(fs) == 0 {
				continue
			}
			s = truncate(pick(fs), int64(rng.IntN(2000)))
		case k < 50:
			if len(fs) == 0 {
				continue
			}
			s = fsync(pick(fs))
			if rng.IntN(2) == 0 {
				s.op = "fdatasync"
			}
		case k < 62:
			s = fsyncDir(pick(dirs()))
		case k < 72:
			if len(fs) == 0 {
				continue
			}
			to, ok := freeFile()
			if rng.IntN(3) == 0 { // over an existing file
				to, ok = pick(fs), true
			}
			if !ok {
				continue
			}
			s = rename(pick(fs), to)
		case k < 76:
			if len(fs) == 0 {
				continue
			}
			to, ok := freeFile()
			if !ok {
				continue
			}
			s = link(pick(fs), to)
		case k < 84:
			if len(fs) == 0 {
				continue
			}
			s = unlink(pick(fs))
		case k < 89:
			var free []string
			for _, p := range []string{"d", "e", "d/e", "e/d"} {
				if parent, _, err := m.resolve(p); err == nil && !m.exists(p) && parent != nil {
					free = append(free, p)
				}
			}
			if len(free) == 0 {
				continue
			}
			s = mkdir(pick(free))
		case k < 93:
			var movable []string
			for _, p := range dirs()[1:] {
				in, _ := m.lookup(p)
				if len(in.entries) == 0 {
					movable = append(movable, p)
				}
			}
			if len(movable) == 0 {
				continue
			}
			p := pick(movable)
			if rng.IntN(2) == 0 {
				s = rmdir(p)
				break
			}
			// Move an empty directory to the other top-level name or
			// into the other directory.
			var targets []string
			for _, q := range []string{"d", "e", "d/e", "e/d"} {
				if parent, _, err := m.resolve(q); err == nil && parent != nil && !m.exists(q) && !strings.HasPrefix(q+"/", p+"/") {
					targets = append(targets, q)
				}
			}
			if len(targets) == 0 {
				continue
			}
			s = rename(p, pick(targets))
		case k < 97:
			if len(fs) == 0 {
				continue
			}
			s = fsyncEIO(pick(fs))
		default:
			s = cut()
		}
		if s.op != "cut" {
			if err := s.onModel(m); err != nil {
				continue
			}
		} else {
			m = reboot(m.survivors())
		}
		script = append(script, s)
	}
	return setup, script
}

// TestPowerCutRandomScripts crashes seeded random scripts at every step
// and checks each survivor tree against the model.
func TestPowerCutRandomScripts(t *testing.T) {
	scripts, steps := 24, 12
	if testing.Short() {
		scripts = 6
	}
	r := newCrashRun(t)
	for seed := range scripts {
		rng := rand.New(rand.NewPCG(uint64(seed), 11))
		setup, script := randomScript(rng, steps)
		r.crashAtEveryStep(fmt.Sprintf("random script %d", seed), setup, script)
		if t.Failed() {
			return // one script's failures are enough to read
		}
	}
}

// TestPowerCutTornWrites cuts the same unsynced writes with TornWrites
// under many seeds: every file must hold its durable content plus a prefix
// of its unsynced changes, the last one possibly cut at a sector boundary,
// and over the seeds both whole and sector-cut prefixes must occur.
func TestPowerCutTornWrites(t *testing.T) {
	setup := []step{create("a"), write("a", 0, strings.Repeat("0", 1000)), create("b"), write("b", 0, "b-durable")}
	script := []step{
		write("a", 100, strings.Repeat("1", 1500)),
		write("a", 2000, strings.Repeat("2", 700)),
		truncate("a", 2300),
		write("a", 50, strings.Repeat("3", 1100)),
		write("b", 0, strings.Repeat("B", 1300)),
		create("c"), write("c", 0, "c-never-named"),
	}
	r := newCrashRun(t)
	wholePrefixes := func(m *model, ino int) map[string]bool {
		in := m.inodes[ino]
		out := map[string]bool{string(in.durable): true}
		state := slices.Clone(in.durable)
		for _, c := range in.pending {
			state = applyChange(state, c)
			out[string(state)] = true
		}
		return out
	}
	sawKept, sawSectorCut, sawNothingKept := false, false, false
	for seed := int64(1); seed <= 24; seed++ {
		m := r.run(setup, script, "torn writes")
		rep, err := r.f.PowerCut(PowerCutOptions{TornWrites: true, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Seed != seed {
			t.Errorf("seed %d: report gives seed %d", seed, rep.Seed)
		}
		got, _ := readTree(t, r.mnt)
		want := m.survivors()
		if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, slices.Sorted(maps.Keys(want))) {
			t.Fatalf("seed %d: names %v, want %v: torn writes tear data, never names", seed, names, slices.Sorted(maps.Keys(want)))
		}
		for p, w := range want {
			allowed := m.tornContents(w.ino)
			g := got[p].data
			if !allowed[g] {
				t.Errorf("seed %d: %s holds %s, which is not its durable content plus a sector-aligned prefix of its unsynced changes", seed, p, describe(got[p]))
				continue
			}
			whole := wholePrefixes(m, w.ino)
			switch {
			case g == w.data:
				sawNothingKept = true
			case !whole[g]:
				sawSectorCut = true
			default:
				sawKept = true
			}
		}
	}
	if !sawKept || !sawSectorCut || !sawNothingKept {
		t.Errorf("over 24 seeds: kept whole changes %v, cut one at a sector %v, kept nothing %v; want all three", sawKept, sawSectorCut, sawNothingKept)
	}
}

// An out-of-order cut leaves each page an unsynced write touched either
// as written or as it was durably, independently of the others (a later
// page can survive an earlier one), and never touches synced content.
func TestPowerCutOutOfOrderKeepsASubsetOfPages(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{SkipBackingSync: true})
	path := filepath.Join(mnt, "f")
	const pages = 16
	durable := bytes.Repeat([]byte{'d'}, pages*4096)
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(durable); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	// Unsynced: pages 4..15 rewritten, one write per page, in order.
	for p := 4; p < pages; p++ {
		if _, err := fh.WriteAt(bytes.Repeat([]byte{byte('A' + p)}, 4096), int64(p)*4096); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := f.PowerCut(PowerCutOptions{OutOfOrder: true, Seed: 7})
	fh.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OutOfOrder || rep.PagesKept+rep.PagesDropped != pages-4 || rep.PagesKept == 0 || rep.PagesDropped == 0 {
		t.Fatalf("expected the 12 dirty pages split between kept and dropped, found %+v", rep)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(durable) {
		t.Fatalf("size %d, expected the durable %d", len(got), len(durable))
	}
	kept, gap := 0, false
	for p := 0; p < pages; p++ {
		pg := got[p*4096 : (p+1)*4096]
		switch {
		case p < 4 && !bytes.Equal(pg, durable[:4096]):
			t.Fatalf("synced page %d changed by the cut", p)
		case p >= 4 && bytes.Equal(pg, bytes.Repeat([]byte{byte('A' + p)}, 4096)):
			kept++
			if p > 4 && gap {
				gap = false // a page kept after one dropped: out of order
				t.Logf("page %d kept after a dropped one", p)
			}
		case p >= 4 && bytes.Equal(pg, durable[:4096]):
			gap = true
		case p >= 4:
			t.Fatalf("page %d is neither as written nor as durable", p)
		}
	}
	if kept != rep.PagesKept {
		t.Fatalf("%d pages kept on disk, report says %d", kept, rep.PagesKept)
	}
}
