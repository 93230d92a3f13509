// Command image builds the lockwarden manager image without a container
// engine: it cross-compiles ./cmd for each platform, puts the static binary,
// the nonroot user and a CA bundle into one layer on an empty base, and writes
// a two-platform OCI image index as an OCI image layout (bin/image/) and as an
// OCI archive (bin/image.tar). With --push it pushes that index to a registry.
//
// It is its own Go module so that go-containerregistry never becomes a
// dependency of the operator. Run it through the Makefile:
//
//	make image                                # build bin/image/ and bin/image.tar
//	make image-push IMG=registry/name:tag     # build, then push
//	make image-check                          # build, then inspect (go test in hack/image)
//
// See docs/image.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	root := fs.String("root", "../..", "Root of the lockwarden repository (the main module, whose ./cmd is built).")
	out := fs.String("out", "bin/image", "Directory of the OCI image layout to write, relative to --root unless absolute. Replaced on every build.")
	archive := fs.String("archive", "bin/image.tar", "OCI archive (a tar of the layout) to write, relative to --root unless absolute. Empty: none.")
	version := fs.String("version", "0.1.0", "Version recorded in the org.opencontainers.image.version label and the layout's reference name.")
	revision := fs.String("revision", "", "Git commit recorded in the org.opencontainers.image.revision label. Default: the commit checked out in --root.")
	caBundle := fs.String("ca-bundle", defaultCABundle, "PEM CA bundle copied to "+caBundlePath+" in the image.")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "Comma-separated os/arch list of the platforms to build.")
	push := fs.String("push", "", "Instead of building, push the index in --out to this reference (registry/name:tag), with credentials from the Docker config.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every input is a flag (see -help)", fs.Arg(0))
	}
	rootDir, err := filepath.Abs(*root)
	if err != nil {
		return err
	}
	outDir := underRoot(rootDir, *out)

	if *push != "" {
		start := time.Now()
		d, err := pushLayout(ctx, outDir, *push)
		if err != nil {
			return err
		}
		fmt.Printf("Pushed %s@%s (%s)\n", *push, d, time.Since(start).Round(time.Millisecond))
		return nil
	}

	plats, err := parsePlatforms(*platforms)
	if err != nil {
		return err
	}
	if *version == "" {
		return errors.New("--version must not be empty: it is the image's version label")
	}
	if err := checkCABundle(*caBundle); err != nil {
		return err
	}
	src, err := gitSource(ctx, rootDir, *revision)
	if err != nil {
		return err
	}
	if src.dirty {
		fmt.Fprintf(os.Stderr, "image: warning: the working tree has uncommitted changes; the build uses the working tree, the revision label says %s\n", src.revision)
	}
	b := builder{
		root:      rootDir,
		version:   *version,
		revision:  src.revision,
		created:   src.commitTime,
		caBundle:  *caBundle,
		platforms: plats,
	}
	start := time.Now()
	res, err := b.build(ctx)
	if err != nil {
		return err
	}
	if err := writeLayout(outDir, res.index, *version); err != nil {
		return err
	}
	fmt.Printf("Wrote OCI image layout %s\n", outDir)
	if *archive != "" {
		archivePath := underRoot(rootDir, *archive)
		if err := writeArchive(outDir, archivePath, src.commitTime); err != nil {
			return err
		}
		fmt.Printf("Wrote OCI archive %s\n", archivePath)
	}
	for _, p := range res.images {
		fmt.Printf("  %-12s %s  layer %s compressed, %s uncompressed\n",
			p.platform, p.digest, mib(p.compressed), mib(p.uncompressed))
	}
	fmt.Printf("Index digest: %s (version %s, revision %s, built in %s)\n",
		res.digest, *version, src.revision, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// underRoot resolves p against root unless p is absolute.
func underRoot(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

// platform is one os/arch pair the image is built for.
type platform struct {
	os, arch string
}

func (p platform) String() string { return p.os + "/" + p.arch }

// supportedArchs are the architectures the image is built and checked for.
var supportedArchs = []string{"amd64", "arm64"}

func parsePlatforms(s string) ([]platform, error) {
	var plats []platform
	for _, f := range strings.Split(s, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(f), "/")
		if !ok || osName != "linux" || !slices.Contains(supportedArchs, arch) {
			return nil, fmt.Errorf("--platforms: %q is not a supported platform (valid: linux/amd64, linux/arm64)", f)
		}
		plats = append(plats, platform{os: osName, arch: arch})
	}
	return plats, nil
}

func mib(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
