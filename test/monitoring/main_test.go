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
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/manager"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
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
	ports, err := freeport.TakeN(2)
	if err != nil {
		return err
	}
	metricsPort, probePort := ports[0], ports[1]
	host, webhookPort, certDir := env.Webhook()
	o, err := manager.ParseFlags([]string{
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort),
		"--metrics-secure=false",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort),
		"--webhook-cert-mode=external",
		"--webhook-cert-dir=" + certDir,
		"--webhook-host=" + host,
		fmt.Sprintf("--webhook-port=%d", webhookPort),
		// The manager keeps its owner key Secret in this namespace.
		"--leader-election-namespace=default",
		"--resync-period=" + resync.String(),
		// The test's Redis is on loopback, which inline endpoints may not
		// reach by default.
		"--endpoint-allow=127.0.0.1/32",
	})
	if err != nil {
		return err
	}
	metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	go func() { stopped <- manager.Run(ctx, env.Config, o) }()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)
	return wait.PollUntilContextCancel(sctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}
