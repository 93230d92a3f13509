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
