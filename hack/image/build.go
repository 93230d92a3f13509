package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image contains, and where.
const (
	binaryPath   = "/lockwarden"
	caBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// defaultCABundle is where Debian's ca-certificates package puts the
	// bundle (hack/ensure-ca-certificates.sh installs it when missing).
	defaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

	// user is the user and group the manager runs as: nonroot, 65532, as in
	// the distroless nonroot images.
	user   = "65532:65532"
	source = "https://github.com/lockwarden/lockwarden"
	title  = "lockwarden"
	// licenses is the SPDX identifier of LICENSE.
	licenses = "Apache-2.0"
)

// passwd and group are the distroless nonroot images' files: root, nobody and
// nonroot (65532, home /home/nonroot), none with a login shell.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"tty:x:5:\n" +
		"staff:x:50:\n" +
		"nonroot:x:65532:\n"
)

// builder builds the image index of one commit.
type builder struct {
	root      string // repository root
	version   string
	revision  string
	created   time.Time // commit time: labels, config and file times
	caBundle  string    // host path of the PEM bundle
	platforms []platform
}

// built is the result of builder.build.
type built struct {
	index  v1.ImageIndex
	digest v1.Hash
	images []builtImage
}

type builtImage struct {
	platform                 platform
	digest                   v1.Hash
	compressed, uncompressed int64
}

func (b builder) build(ctx context.Context) (built, error) {
	ca, err := os.ReadFile(b.caBundle)
	if err != nil {
		return built{}, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var res built
	for _, p := range b.platforms {
		bin, err := b.compile(ctx, p)
		if err != nil {
			return built{}, err
		}
		layerTar, err := b.layer(bin, ca)
		if err != nil {
			return built{}, err
		}
		img, err := b.image(p, layerTar)
		if err != nil {
			return built{}, fmt.Errorf("%s: %w", p, err)
		}
		d, err := img.Digest()
		if err != nil {
			return built{}, err
		}
		m, err := img.Manifest()
		if err != nil {
			return built{}, err
		}
		res.images = append(res.images, builtImage{
			platform: p, digest: d,
			compressed: m.Layers[0].Size, uncompressed: int64(len(layerTar)),
		})
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: p.os, Architecture: p.arch},
			},
		})
	}
	res.index = idx
	res.digest, err = idx.Digest()
	return res, err
}

// compile cross-compiles ./cmd into a static binary and returns its bytes.
func (b builder) compile(ctx context.Context, p platform) ([]byte, error) {
	dir, err := os.MkdirTemp("", "lockwarden-image-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	out := filepath.Join(dir, "lockwarden")
	// The manager has no version variable to stamp with -X. -buildvcs=false:
	// the binary is the Dockerfile's (whose build context has no .git), and
	// the commit is in the revision label.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", out, "./cmd")
	cmd.Dir = b.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	fmt.Fprintf(os.Stderr, "Building %s for %s\n", binaryPath, p)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build ./cmd for %s: %w", p, err)
	}
	return os.ReadFile(out)
}

// layer returns the image's only layer as an uncompressed tar: the binary, the
// nonroot user and the CA bundle, with the commit time as every file's time
// so that the same commit always gives the same bytes.
func (b builder) layer(bin, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: b.created, Format: tar.FormatPAX,
		})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: b.created, Format: tar.FormatPAX,
		}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	steps := []func() error{
		func() error { return dir("etc/") },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("etc/ssl/") },
		func() error { return dir("etc/ssl/certs/") },
		func() error { return file(strings.TrimPrefix(caBundlePath, "/"), 0o644, ca) },
		func() error { return file(strings.TrimPrefix(binaryPath, "/"), 0o755, bin) },
		tw.Close,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// image wraps the layer into an OCI image with the manager's configuration.
func (b builder) image(p platform, layerTar []byte) (v1.Image, error) {
	// Compress once, at the best level; the layer reads it back for its digests.
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(layerTar); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := gz.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: b.created},
			CreatedBy: "lockwarden hack/image: " + binaryPath + ", /etc/passwd, /etc/group, " + caBundlePath,
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = p.os
	cf.Architecture = p.arch
	cf.Created = v1.Time{Time: b.created}
	cf.Config = v1.Config{
		User:       user,
		Entrypoint: []string{binaryPath},
		WorkingDir: "/",
		// The environment of the distroless base images.
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=" + caBundlePath,
		},
		Labels: b.labels(),
	}
	return mutate.ConfigFile(img, cf)
}

// labels are the OCI annotations of the image configuration.
func (b builder) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.version":  b.version,
		"org.opencontainers.image.revision": b.revision,
		"org.opencontainers.image.source":   source,
		"org.opencontainers.image.title":    title,
		"org.opencontainers.image.licenses": licenses,
		"org.opencontainers.image.created":  b.created.UTC().Format(time.RFC3339),
	}
}

// checkCABundle fails with the command that installs the bundle when path is
// missing or holds no certificate.
func checkCABundle(path string) error {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return fmt.Errorf("--ca-bundle %s does not exist: install Debian's CA bundle with: apt-get install -y ca-certificates (or run hack/ensure-ca-certificates.sh)", path)
	}
	if err != nil {
		return fmt.Errorf("--ca-bundle: %w", err)
	}
	n := 0
	for rest := data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("--ca-bundle %s: certificate %d: %w", path, n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("--ca-bundle %s holds no PEM certificate", path)
	}
	return nil
}

// gitInfo is what the image records of the commit it is built from.
type gitInfo struct {
	revision   string
	commitTime time.Time
	dirty      bool
}

// gitSource reads the checked-out commit of root (or revision, when set) and
// its commit time.
func gitSource(ctx context.Context, root, revision string) (gitInfo, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	rev := revision
	if rev == "" {
		rev = "HEAD"
	}
	full, err := git("rev-parse", "--verify", rev+"^{commit}")
	if err != nil {
		return gitInfo{}, fmt.Errorf("--revision %q is not a commit of %s: %w", rev, root, err)
	}
	ts, err := git("show", "-s", "--format=%ct", full)
	if err != nil {
		return gitInfo{}, err
	}
	var secs int64
	if _, err := fmt.Sscan(ts, &secs); err != nil {
		return gitInfo{}, fmt.Errorf("commit time %q of %s: %w", ts, full, err)
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return gitInfo{}, err
	}
	return gitInfo{revision: full, commitTime: time.Unix(secs, 0).UTC(), dirty: status != ""}, nil
}
