package container

import (
	"context"
	"errors"
	"fmt"
	"github.com/tidaldb/tidal/harness/procstart"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
)

// owner identifies the harness process that created a run's resources:
// host name, pid and the process's start time in clock ticks after boot
// (pids are reused; a pid with another start time is another process).
type owner struct {
	Host  string
	PID   int
	Start int64
}

func (o owner) String() string {
	return o.Host + "/" + strconv.Itoa(o.PID) + "/" + strconv.FormatInt(o.Start, 10)
}

func parseOwner(s string) (owner, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return owner{}, fmt.Errorf("owner label %q: expected host/pid/start", s)
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return owner{}, fmt.Errorf("owner label %q: expected a pid, found %q", s, parts[1])
	}
	start, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return owner{}, fmt.Errorf("owner label %q: expected a start time, found %q", s, parts[2])
	}
	return owner{Host: parts[0], PID: pid, Start: start}, nil
}

func currentOwner() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", err
	}
	start, err := startTime(os.Getpid())
	if err != nil {
		return "", err
	}
	return owner{Host: host, PID: os.Getpid(), Start: start}.String(), nil
}

// startTime is the kernel's record of when pid started (see procstart:
// gopsutil's wall-clock derivation moves by a second between readers in
// a container, which made a live run look gone to another run's reaper).
func startTime(pid int) (int64, error) { return procstart.Of(pid) }

// gone reports whether the run owned by label has ended: its owner is a
// process of this host that no longer runs (or whose pid now belongs to a
// process started at another time). A run of another host, or an owner
// label this package did not write, is never judged gone.
func gone(label, host string) bool {
	o, err := parseOwner(label)
	if err != nil || o.Host != host {
		return false
	}
	start, err := startTime(o.PID)
	return err != nil || start != o.Start
}

// Reap removes the containers, networks and volumes of every run whose
// owner is gone (see gone), and returns what it removed. A harness that
// crashed, or was killed before its cleanup, leaves nothing behind for
// longer than the next run's start.
func Reap(ctx context.Context, cli client.APIClient) ([]string, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	owners, err := runOwners(ctx, cli)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, run := range sortedKeys(owners) {
		if !gone(owners[run], host) {
			continue
		}
		r, err := RemoveRun(ctx, cli, run)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// runOwners maps every run id found on a labelled container, network or
// volume to its owner label.
func runOwners(ctx context.Context, cli client.APIClient) (map[string]string, error) {
	f := filters.NewArgs(filters.Arg("label", LabelRun))
	owners := map[string]string{}
	note := func(labels map[string]string) {
		if run := labels[LabelRun]; run != "" && owners[run] == "" {
			owners[run] = labels[LabelOwner]
		}
	}
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		note(c.Labels)
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	for _, n := range ns {
		note(n.Labels)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vs.Volumes {
		note(v.Labels)
	}
	return owners, nil
}

// RemoveRun removes every container (running or not, with its anonymous
// volumes), network and volume labelled tidal.run=run, containers first
// (a network with endpoints cannot go). It returns what it removed, as
// "container NAME", "network NAME", "volume NAME".
func RemoveRun(ctx context.Context, cli client.APIClient, run string) ([]string, error) {
	f := filters.NewArgs(filters.Arg("label", LabelRun+"="+run))
	var removed []string
	var errs []error
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("run %s: list containers: %w", run, err)
	}
	for _, c := range cs {
		name := c.ID[:12]
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s: %w", name, err))
			continue
		}
		removed = append(removed, "container "+name)
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		errs = append(errs, fmt.Errorf("run %s: list networks: %w", run, err))
	}
	for _, n := range ns {
		if err := cli.NetworkRemove(ctx, n.ID); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("remove network %s: %w", n.Name, err))
			continue
		}
		removed = append(removed, "network "+n.Name)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		errs = append(errs, fmt.Errorf("run %s: list volumes: %w", run, err))
	}
	for _, v := range vs.Volumes {
		if err := cli.VolumeRemove(ctx, v.Name, true); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("remove volume %s: %w", v.Name, err))
			continue
		}
		removed = append(removed, "volume "+v.Name)
	}
	return removed, errors.Join(errs...)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
