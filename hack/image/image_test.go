package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The tests inspect an image that make image built; they build nothing
// themselves. make image-check builds it and sets these:
const (
	envImageDir = "LOCKWARDEN_IMAGE_DIR"      // the OCI layout (bin/image)
	envRevision = "LOCKWARDEN_IMAGE_REVISION" // the commit it was built from; default: HEAD
	envVersion  = "LOCKWARDEN_IMAGE_VERSION"  // the version it was built as; default: 0.1.0
)

// wantFiles is every entry of the image's filesystem: no shell, no package
// database, nothing but the manager, its user and the CA bundle.
var wantFiles = []string{
	"etc/",
	"etc/group",
	"etc/passwd",
	"etc/ssl/",
	"etc/ssl/certs/",
	"etc/ssl/certs/ca-certificates.crt",
	"lockwarden",
}

var wantMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// imageDir returns the layout to inspect, or skips when none was named.
func imageDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(envImageDir)
	if dir == "" {
		t.Skipf("%s is unset: these tests inspect the image make image builds; run make image-check", envImageDir)
	}
	return dir
}

func wantRevision(t *testing.T) string {
	t.Helper()
	if rev := os.Getenv(envRevision); rev != "" {
		return rev
	}
	out, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD (set %s to the image's commit instead): %v", envRevision, err)
	}
	return strings.TrimSpace(string(out))
}

// fsEntry is one file of an image's flattened filesystem.
type fsEntry struct {
	hdr  *tar.Header
	data []byte
}

// inspected is what TestImage found in one platform's image.
type inspected struct {
	platform     string
	digest       v1.Hash
	config       v1.Config
	created      time.Time
	compressed   int64
	uncompressed int64
	binary       []byte
	certs        int
}

func TestImage(t *testing.T) {
	dir := imageDir(t)
	revision := wantRevision(t)
	version := os.Getenv(envVersion)
	if version == "" {
		version = "0.1.0"
	}
	idx, err := loadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}

	var platforms []string
	images := map[string]*inspected{}
	for _, desc := range im.Manifests {
		if desc.Platform == nil {
			t.Fatalf("index entry %s has no platform", desc.Digest)
		}
		p := desc.Platform.OS + "/" + desc.Platform.Architecture
		platforms = append(platforms, p)
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		t.Run(strings.ReplaceAll(p, "/", "_"), func(t *testing.T) {
			images[p] = inspectImage(t, img, desc, revision, version)
		})
	}
	sort.Strings(platforms)
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Fatalf("index %s has platforms %v, want %v", idxDigest, platforms, want)
	}

	t.Logf("\n%s", report(idxDigest, platforms, images))

	host := runtime.GOOS + "/" + runtime.GOARCH
	got, ok := images[host]
	if !ok || got.binary == nil {
		t.Skipf("the image has no %s binary this machine can run", host)
	}
	bin := filepath.Join(t.TempDir(), "lockwarden")
	if err := os.WriteFile(bin, got.binary, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("run "+host+" --help", func(t *testing.T) {
		out, err := runBinary(t, bin, "--help")
		if err != nil {
			t.Fatalf("lockwarden --help: %v, want exit 0; output:\n%s", err, out)
		}
		for _, flag := range []string{"-leader-elect", "-webhook-cert-mode", "-metrics-bind-address"} {
			if !strings.Contains(out, flag) {
				t.Errorf("lockwarden --help does not mention %s; output:\n%s", flag, out)
			}
		}
	})
	t.Run("run "+host+" with a bad flag", func(t *testing.T) {
		out, err := runBinary(t, bin, "--no-such-flag")
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("lockwarden --no-such-flag: %v, want a non-zero exit; output:\n%s", err, out)
		}
		if !strings.Contains(out, "flag provided but not defined: -no-such-flag") {
			t.Errorf("lockwarden --no-such-flag does not name the flag; output:\n%s", out)
		}
		t.Logf("lockwarden --no-such-flag: exit %d, %q", exit.ExitCode(), firstLine(out))
	})
}

// inspectImage checks one platform's image as a user of it would see it.
func inspectImage(t *testing.T, img v1.Image, desc v1.Descriptor, revision, version string) *inspected {
	t.Helper()
	arch := desc.Platform.Architecture
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	got := &inspected{platform: desc.Platform.OS + "/" + arch, digest: desc.Digest, config: cf.Config, created: cf.Created.Time}

	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("config says %s/%s, the index says linux/%s", cf.OS, cf.Architecture, arch)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/lockwarden"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want entrypoint [/lockwarden] and no cmd", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if cf.Config.WorkingDir != "/" {
		t.Errorf("working dir %q, want /", cf.Config.WorkingDir)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.source":   "https://github.com/lockwarden/lockwarden",
		"org.opencontainers.image.title":    "lockwarden",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.created":  cf.Created.UTC().Format(time.RFC3339),
	}
	for k, want := range wantLabels {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if len(cf.Config.Labels) != len(wantLabels) {
		t.Errorf("labels %v, want exactly %v", cf.Config.Labels, wantLabels)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		got.compressed += n
	}

	files := extract(t, img)
	var names []string
	for n, e := range files {
		names = append(names, n)
		got.uncompressed += e.hdr.Size
	}
	sort.Strings(names)
	if !slices.Equal(names, wantFiles) {
		t.Errorf("files in the image:\n  %s\nwant exactly:\n  %s", strings.Join(names, "\n  "), strings.Join(wantFiles, "\n  "))
	}
	for _, shell := range []string{"bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh", "bin/ash", "busybox/sh"} {
		if _, ok := files[shell]; ok {
			t.Errorf("the image contains a shell: /%s", shell)
		}
	}

	if e, ok := files["etc/passwd"]; !ok || !strings.Contains(string(e.data), "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") {
		t.Errorf("/etc/passwd has no nonroot user 65532 with home /home/nonroot:\n%s", fileData(files, "etc/passwd"))
	}
	if e, ok := files["etc/group"]; !ok || !strings.Contains(string(e.data), "\nnonroot:x:65532:\n") {
		t.Errorf("/etc/group has no nonroot group 65532:\n%s", fileData(files, "etc/group"))
	}
	got.certs = countCerts(t, fileData(files, "etc/ssl/certs/ca-certificates.crt"))

	bin, ok := files["lockwarden"]
	if !ok {
		return got
	}
	if bin.hdr.Typeflag != tar.TypeReg || bin.hdr.Mode&0o005 != 0o005 || bin.hdr.Uid != 0 {
		t.Errorf("/lockwarden is type %c mode %o owner %d, want a regular file owned by root that others (65532) can read and run",
			bin.hdr.Typeflag, bin.hdr.Mode, bin.hdr.Uid)
	}
	checkStaticELF(t, bin.data, wantMachine[arch])
	got.binary = bin.data
	return got
}

// extract returns the flattened filesystem of img by path (no leading /,
// directories with a trailing /).
func extract(t *testing.T, img v1.Image) map[string]fsEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	files := map[string]fsEntry{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read the image's filesystem: %v", err)
		}
		n := strings.TrimPrefix(hdr.Name, "./")
		n = strings.TrimPrefix(n, "/")
		if hdr.Typeflag == tar.TypeDir && !strings.HasSuffix(n, "/") {
			n += "/"
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read /%s: %v", n, err)
		}
		files[n] = fsEntry{hdr: hdr, data: data}
	}
	return files
}

func fileData(files map[string]fsEntry, n string) []byte {
	return files[n].data
}

// countCerts asserts that the bundle is a list of PEM certificates that Go
// parses, and returns how many it holds.
func countCerts(t *testing.T, data []byte) int {
	t.Helper()
	n := 0
	for rest := data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				t.Errorf("%s: %d bytes after certificate %d are not PEM", caBundlePath, len(rest), n)
			}
			break
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			t.Errorf("%s: certificate %d: %v", caBundlePath, n+1, err)
		}
		n++
	}
	if n == 0 {
		t.Errorf("%s holds no certificate", caBundlePath)
	}
	return n
}

// checkStaticELF asserts that bin is a 64-bit Linux executable for machine
// with no program interpreter and no dynamic section: it runs without libc.
func checkStaticELF(t *testing.T, bin []byte, machine elf.Machine) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Errorf("/lockwarden is not an ELF file: %v", err)
		return
	}
	if f.Machine != machine || f.Class != elf.ELFCLASS64 || f.Type != elf.ET_EXEC {
		t.Errorf("/lockwarden is %v %v %v, want %v ELFCLASS64 ET_EXEC", f.Machine, f.Class, f.Type, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/lockwarden has a %v program header: it is not a static binary", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) != 0 {
		t.Errorf("/lockwarden imports libraries %v (err %v), want none", libs, err)
	}
}

// runBinary runs bin with args and returns its combined output. A manager
// that does not exit on a flag error would hang: the deadline ends it.
func runBinary(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Nothing the flags print may depend on the test's environment.
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("still running after a minute: %w", ctx.Err())
	}
	return string(out), err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// report renders the inspection for go test -v.
func report(idx v1.Hash, platforms []string, images map[string]*inspected) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Image index %s\n", idx)
	for _, p := range platforms {
		im := images[p]
		if im == nil {
			continue
		}
		fmt.Fprintf(&b, "  %s  manifest %s\n", p, im.digest)
		fmt.Fprintf(&b, "    user %s  entrypoint %q  workdir %s  created %s\n",
			im.config.User, im.config.Entrypoint, im.config.WorkingDir, im.created.UTC().Format(time.RFC3339))
		fmt.Fprintf(&b, "    size %s compressed, %s uncompressed (binary %s), CA bundle %d certificates\n",
			mib(im.compressed), mib(im.uncompressed), mib(int64(len(im.binary))), im.certs)
		var keys []string
		for k := range im.config.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "    label %s=%s\n", k, im.config.Labels[k])
		}
	}
	return b.String()
}

// TestPushToRegistry pushes the built index with the same code as make
// image-push, to go-containerregistry's in-memory registry, and pulls it back.
func TestPushToRegistry(t *testing.T) {
	dir := imageDir(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/lockwarden/lockwarden:v0.1.0-test"

	pushed, err := pushLayout(context.Background(), dir, ref)
	if err != nil {
		t.Fatal(err)
	}
	local, err := loadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := local.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if pushed != want {
		t.Errorf("pushLayout returned %s, the layout's index is %s", pushed, want)
	}

	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	remoteIdx, err := remote.Index(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	got, err := remoteIdx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("the registry serves %s as %s, the layout's index is %s", ref, got, want)
	}
	// Every platform resolves, down to its layers' blobs.
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := remote.Image(r, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
		if err != nil {
			t.Fatalf("pull %s for linux/%s: %v", ref, arch, err)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("linux/%s layer: %v", arch, err)
			}
			n, err := io.Copy(io.Discard, rc)
			_ = rc.Close()
			if err != nil || n == 0 {
				t.Fatalf("linux/%s layer: read %d bytes: %v", arch, n, err)
			}
		}
		d, _ := img.Digest()
		t.Logf("pulled %s for linux/%s: %s", ref, arch, d)
	}
}
