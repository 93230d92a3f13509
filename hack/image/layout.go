package main

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// refNameAnnotation names the index in the layout's index.json, as a tag.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// writeLayout replaces dir with an OCI image layout whose index.json holds one
// entry: the multi-platform index, named v<version>.
func writeLayout(dir string, idx v1.ImageIndex, version string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	tag := version
	if !strings.HasPrefix(tag, "v") {
		tag = "v" + tag
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: tag})); err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	return nil
}

// loadIndex opens the multi-platform index that writeLayout wrote to dir.
func loadIndex(dir string) (v1.ImageIndex, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open OCI layout %s (run make image first): %w", dir, err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("OCI layout %s: index.json should hold exactly one image index, it holds %d entries", dir, len(m.Manifests))
	}
	return root.ImageIndex(m.Manifests[0].Digest)
}

// pushLayout pushes the index in dir, both platforms, to ref with the
// credentials of the Docker config ($DOCKER_CONFIG or ~/.docker/config.json)
// and returns the pushed index digest.
func pushLayout(ctx context.Context, dir, ref string) (v1.Hash, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("--push %q is not an image reference (registry/name:tag): %w", ref, err)
	}
	idx, err := loadIndex(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", r, err)
	}
	return idx.Digest()
}

// writeArchive writes the layout in dir as an OCI archive: a tar of the
// layout's files in name order, each with mtime, owner root and mode 0644
// (directories 0755), so that one commit always gives the same archive.
func writeArchive(dir, archive string, mtime time.Time) (err error) {
	if err := os.MkdirAll(filepath.Dir(archive), 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(archive), ".image-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	fsys := root.FS()
	tw := tar.NewWriter(tmp)
	// WalkDir visits entries in lexical order.
	err = fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == "." {
			return err
		}
		hdr := &tar.Header{Name: path, ModTime: mtime, Format: tar.FormatPAX}
		if d.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, path+"/", 0o755
			return tw.WriteHeader(hdr)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		f, err := fsys.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, st.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("write OCI archive %s: %w", archive, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), archive)
}
