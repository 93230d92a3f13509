// Command kubectl-lockwarden is the kubectl plugin of lockwarden: put it on
// the PATH and run `kubectl lockwarden`. See docs/kubectl-plugin.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockwarden/lockwarden/internal/cli"
)

func main() {
	// The plugin reports through its output and errors; controller-runtime's
	// client would otherwise warn, on stderr, that no logger was set.
	logf.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Execute(ctx, genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, os.Args[1:])
	stop()
	if err != nil {
		os.Exit(1)
	}
}
