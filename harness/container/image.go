package container

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

// UID and GID are the image's user: a numeric, unprivileged id (as
// distroless "nonroot" uses), since FROM scratch has no useradd.
const (
	UID = 65532
	GID = 65532
)

// Image describes one of the project's images: a static binary in an
// otherwise empty filesystem. The images are defined here, once: `make
// images` (harness/cmd/tidal-images) and the container backend build the
// same thing.
type Image struct {
	// Repository is the image name without a tag: "tidal-server".
	Repository string
	// Program is the binary's name inside the image (/usr/local/bin/...).
	Program string
	// Cmd is the default command after the entrypoint.
	Cmd []string
	// Ports are documented with EXPOSE.
	Ports []int
	// DataVolume, when set, is a directory owned by the image's user and
	// declared a VOLUME; it is also the working directory.
	DataVolume string
}

// ServerImage is tidal-server. Its default command runs one node with its
// data in the /data volume, listening on every interface of the container
// (a port published with `-p 127.0.0.1:7070:7070` reaches it) — which a
// node without certificates refuses: add --certs-dir (mounted), or
// --insecure to accept plaintext without authentication. The harness and
// deploy/ always pass their own arguments.
var ServerImage = Image{
	Repository: "tidal-server",
	Program:    "tidal-server",
	Cmd:        []string{"run", "--data-dir", "/data", "--client-addr", "0.0.0.0:7070", "--peer-addr", "0.0.0.0:7100"},
	Ports:      []int{7070, 7100},
	DataVolume: "/data",
}

// RelayImage is tcp-relay with its control API on every interface of the
// container.
var RelayImage = Image{
	Repository: "tcp-relay",
	Program:    "tcp-relay",
	Cmd:        []string{"--control", "0.0.0.0:8474"},
	Ports:      []int{8474},
}

// Dockerfile is the image's build recipe. It needs only the legacy
// builder (no BuildKit, no buildx, nothing pulled): COPY --chown is how a
// FROM scratch image gets a directory its non-root user owns.
func (im Image) Dockerfile() string {
	var b strings.Builder
	b.WriteString("FROM scratch\n")
	b.WriteString("COPY passwd group /etc/\n")
	fmt.Fprintf(&b, "COPY --chown=%d:%d tmp /tmp\n", UID, GID)
	if im.DataVolume != "" {
		fmt.Fprintf(&b, "COPY --chown=%d:%d data %s\n", UID, GID, im.DataVolume)
	}
	fmt.Fprintf(&b, "COPY %s /usr/local/bin/%s\n", im.Program, im.Program)
	fmt.Fprintf(&b, "USER %d:%d\n", UID, GID)
	if im.DataVolume != "" {
		fmt.Fprintf(&b, "WORKDIR %s\n", im.DataVolume)
		fmt.Fprintf(&b, "VOLUME [%q]\n", im.DataVolume)
	}
	for _, p := range im.Ports {
		fmt.Fprintf(&b, "EXPOSE %d\n", p)
	}
	entry, _ := json.Marshal([]string{"/usr/local/bin/" + im.Program})
	cmd, _ := json.Marshal(im.Cmd)
	fmt.Fprintf(&b, "ENTRYPOINT %s\nCMD %s\n", entry, cmd)
	return b.String()
}

// passwd and group name the image's user, so tools that look the uid up
// (and people reading `ps` on the host) see a name.
var (
	passwd = fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\ntidal:x:%d:%d:tidal:/data:/sbin/nologin\n", UID, GID)
	group  = fmt.Sprintf("root:x:0:\ntidal:x:%d:\n", GID)
)

// CheckStatic returns an error unless path is an ELF executable without
// a dynamic interpreter: in a FROM scratch image a dynamically linked
// binary fails to start with a bare "no such file or directory".
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: expected a static Linux executable (CGO_ENABLED=0 go build): %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(p.Open(), 256))
			return fmt.Errorf("%s: expected a static executable, found one linked against %s (build with CGO_ENABLED=0 and without -race)",
				path, strings.TrimRight(string(interp), "\x00"))
		}
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s: expected an executable, found ELF type %v", path, f.Type)
	}
	return nil
}

// Context is the build context of im around binary: a tar stream with the
// Dockerfile, the binary, passwd, group and the empty directories. Every
// header has a fixed time and owner, so equal inputs give equal bytes.
func (im Image) Context(binary []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	add := func(name string, mode int64, data []byte) error {
		h := &tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, e := range []struct {
		name string
		mode int64
		data []byte
	}{
		{"Dockerfile", 0o644, []byte(im.Dockerfile())},
		{"passwd", 0o644, []byte(passwd)},
		{"group", 0o644, []byte(group)},
		{"tmp/", 0o1777, nil},
		{"data/", 0o750, nil},
		{im.Program, 0o755, binary},
	} {
		if err := add(e.name, e.mode, e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ContentTag is the tag that names im built around binary: a hash of the
// build context, so a rebuilt binary (or a changed recipe) gets a new
// image and an unchanged one is found instead of rebuilt.
func (im Image) ContentTag(context []byte) string {
	sum := sha256.Sum256(context)
	return "bin-" + hex.EncodeToString(sum[:8])
}

// Ref is repository:tag.
func (im Image) Ref(tag string) string { return im.Repository + ":" + tag }

var badTagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// VersionTag turns a version string (`git describe` output) into a valid
// image tag: invalid characters become '-', at most 128 characters.
func VersionTag(version string) string {
	t := badTagChars.ReplaceAllString(version, "-")
	t = strings.TrimLeft(t, ".-")
	if t == "" {
		return "dev"
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// Build builds im around the binary at path unless an image with its
// content tag exists, and adds the extra tags either way. It returns the
// content-tagged reference. Only the daemon is needed: the legacy builder
// builds FROM scratch without BuildKit and pulls nothing.
func (im Image) Build(ctx context.Context, cli client.APIClient, path string, extraTags ...string) (string, error) {
	if err := CheckStatic(path); err != nil {
		return "", err
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tarCtx, err := im.Context(bin)
	if err != nil {
		return "", err
	}
	ref := im.Ref(im.ContentTag(tarCtx))
	if _, err := cli.ImageInspect(ctx, ref); err == nil {
		for _, t := range extraTags {
			if err := cli.ImageTag(ctx, ref, im.Ref(t)); err != nil {
				return "", fmt.Errorf("tag %s as %s: %w", ref, im.Ref(t), err)
			}
		}
		return ref, nil
	} else if !client.IsErrNotFound(err) {
		return "", fmt.Errorf("inspect image %s: %w", ref, err)
	}
	tags := []string{ref}
	for _, t := range extraTags {
		tags = append(tags, im.Ref(t))
	}
	resp, err := cli.ImageBuild(ctx, bytes.NewReader(tarCtx), build.ImageBuildOptions{
		Tags:        tags,
		Remove:      true,
		ForceRemove: true,
		Version:     build.BuilderV1,
		Labels:      map[string]string{"org.opencontainers.image.title": im.Repository},
	})
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", ref, err)
	}
	defer resp.Body.Close()
	if err := buildOutcome(resp.Body); err != nil {
		return "", fmt.Errorf("build image %s: %w", ref, err)
	}
	im.untagStale(ctx, cli, ref)
	return ref, nil
}

// buildOutcome reads the build's JSON message stream to its end and
// returns the error it reports, if any; the daemon answers 200 and puts a
// failed step in the stream.
func buildOutcome(r io.Reader) error {
	dec := json.NewDecoder(r)
	var tail []string
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading the build output: %w", err)
		}
		if s := strings.TrimSpace(msg.Stream); s != "" {
			tail = append(tail, s)
			if len(tail) > 5 {
				tail = tail[1:]
			}
		}
		if msg.Error != "" {
			return fmt.Errorf("%s (last steps: %s)", msg.Error, strings.Join(tail, " | "))
		}
	}
}

// staleAfter is how old an earlier build must be before its content tag
// is removed: another run (another worktree's binary) may be between
// building its image and creating containers from it.
const staleAfter = time.Hour

// untagStale removes the content tags of im's earlier builds, so a
// developer's daemon does not collect one image per rebuilt binary. An
// image still used by a container, or tagged otherwise (a version), stays.
func (im Image) untagStale(ctx context.Context, cli client.APIClient, keep string) {
	imgs, err := cli.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return
	}
	for _, img := range imgs {
		if time.Since(time.Unix(img.Created, 0)) < staleAfter {
			continue
		}
		for _, t := range img.RepoTags {
			if strings.HasPrefix(t, im.Repository+":bin-") && t != keep {
				cli.ImageRemove(ctx, t, image.RemoveOptions{})
			}
		}
	}
}
