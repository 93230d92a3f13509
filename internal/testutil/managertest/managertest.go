// Package managertest runs lockwarden's manager in a test process exactly as
// cmd/main.go runs it (internal/manager, from command-line flags), against a
// kubetest control plane.
package managertest

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/lockwarden/lockwarden/internal/manager"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// readyTimeout bounds how long Start waits for the manager's /readyz.
const readyTimeout = 2 * time.Minute

// Start runs the manager as cfg's user against e with args, after these
// flags (which args may override): a health probe on a free loopback port,
// and the webhook server where e's webhook configuration points, with its
// certificate (e must have been started with kubetest.WithWebhooks). The
// manager runs until ctx ends, then its result is sent on stopped. Start
// returns once /readyz answers 200, or an error; when the flags are
// invalid the manager does not run and nothing is sent on stopped.
func Start(ctx context.Context, e *kubetest.Env, cfg *rest.Config, args []string, stopped chan<- error) error {
	probePort, err := freeport.Take()
	if err != nil {
		return err
	}
	host, port, certDir := e.Webhook()
	o, err := manager.ParseFlags(append([]string{
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort),
		"--webhook-cert-mode=external",
		"--webhook-cert-dir=" + certDir,
		"--webhook-host=" + host,
		fmt.Sprintf("--webhook-port=%d", port),
	}, args...))
	if err != nil {
		return err
	}
	go func() { stopped <- manager.Run(ctx, cfg, o) }()
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)
	err = wait.PollUntilContextCancel(rctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
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
	if err != nil {
		return fmt.Errorf("the manager did not become ready (%s) within %v: %w", ready, readyTimeout, err)
	}
	return nil
}
