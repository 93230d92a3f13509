package kubetest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Main is the TestMain of a suite that runs one manager against one control
// plane: it starts the control plane with opts, calls setUp (which starts
// what the suite needs and sends the manager's result on stopped once ctx
// ends), runs the tests, then stops everything and exits, failing when the
// manager stopped with an error. Under -short it runs the tests without a
// control plane (they skip). LOCKWARDEN_TEST_LOG turns on verbose logs.
func Main(m *testing.M, suite string, setUp func(ctx context.Context, e *Env, stopped chan<- error) error, opts ...Option) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	level := zapcore.ErrorLevel
	if os.Getenv("LOCKWARDEN_TEST_LOG") != "" {
		level = zapcore.Level(-2)
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(level)))
	e, err := StartEnv(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	err = setUp(ctx, e, stopped)
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "set up the %s suite: %v\n", suite, err)
	} else {
		code = m.Run()
	}
	cancel()
	if err == nil {
		if err := <-stopped; err != nil {
			fmt.Fprintln(os.Stderr, "the manager stopped with:", err)
			code = 1
		}
	}
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

// MainEnv is the TestMain of a suite that runs no manager: under -short it
// runs the tests without a control plane (they skip); otherwise it starts
// one with opts, calls setUp (which may return a cleanup, run after the
// tests), runs the tests, then cleans up, stops the control plane and exits.
// A control plane that does not start, or a failed setUp, fails the suite:
// it must not pass without running.
func MainEnv(m *testing.M, suite string, setUp func(e *Env) (cleanup func(), err error), opts ...Option) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	e, err := StartEnv(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cleanup, err := setUp(e)
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "set up the %s suite: %v\n", suite, err)
	} else {
		code = m.Run()
	}
	if cleanup != nil {
		cleanup()
	}
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}
