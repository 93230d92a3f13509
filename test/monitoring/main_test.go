// Package monitoring checks lockwarden's monitoring against the metrics the
// manager really exports: every metric the alerts (config/prometheus) and
// the Grafana dashboard (config/grafana) query must be on the manager's
// /metrics endpoint after ordinary use.
//
// The manager runs in this process exactly as cmd/main.go runs it
// (internal/manager, from command-line flags) against a real kube-apiserver
// and etcd (envtest) with lockwarden's Job webhook installed, and serves its
// metrics on a loopback port over plain HTTP (--metrics-secure=false), which
// the test scrapes. Locks live in a real redis-server. The checks of the
// files themselves (the dashboard parses, every alert has a runbook) and of
// the PromQL name extractor need none of that and also run with -short.
package monitoring

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
)

// resync is the manager's --resync-period: how often every lock's status,
// and its gauges, follow the backend.
const resync = time.Second

var (
	// env is the control plane; nil under -short.
	env *kubetest.Env
	// metricsURL is the manager's metrics endpoint.
	metricsURL string
)

func TestMain(m *testing.M) {
	kubetest.Main(m, "monitoring", func(ctx context.Context, e *kubetest.Env, stopped chan<- error) error {
		env = e
		return startManager(ctx, stopped)
	}, kubetest.WithWebhooks())
}

// startManager starts the manager with plain-HTTP metrics on a free loopback
// port and waits until it is ready; stopped receives its result once ctx
// ends.
func startManager(ctx context.Context, stopped chan<- error) error {
	metricsPort, err := freeport.Take()
	if err != nil {
		return err
	}
	metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	return managertest.Start(ctx, env, env.Config, []string{
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort),
		"--metrics-secure=false",
		// The manager keeps its owner key Secret in this namespace.
		"--leader-election-namespace=default",
		"--resync-period=" + resync.String(),
		// The test's Redis is on loopback, which inline endpoints may not
		// reach by default.
		"--endpoint-allow=127.0.0.1/32",
	}, stopped)
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}
