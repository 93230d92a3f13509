package devcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildManager builds the operator (go build -o out ./cmd) in the checkout
// at root. Go's build cache makes a rebuild of unchanged code quick.
func BuildManager(ctx context.Context, root, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o750); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -o %s ./cmd: %w", out, err)
	}
	return nil
}

// StartFromSource builds the operator from the checkout into dir/bin and
// starts a cluster with its state in dir/cluster: what a test suite does to
// test the code as it is, away from bin/, where a running `make dev` uses it.
// Options.Root, Dir and Manager are filled in; the rest is used as given.
func StartFromSource(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	if opts.Root == "" {
		root, err := FindRoot()
		if err != nil {
			return nil, err
		}
		opts.Root = root
	}
	opts.Manager = filepath.Join(dir, "bin", "lockwarden")
	if err := BuildManager(ctx, opts.Root, opts.Manager); err != nil {
		return nil, err
	}
	opts.Dir = filepath.Join(dir, "cluster")
	return Start(ctx, opts)
}
