// Package hostile runs lockwarden as a shared cluster service and attacks it
// as a tenant would: a user with only the usual edit rights in their own
// namespaces (the built-in edit ClusterRole, bound by a RoleBinding), acting
// through the API server.
//
// The cluster is a real kube-apiserver and etcd (envtest) with everything a
// real installation puts around the manager: the Job admission webhook
// (config/webhook), the admission policy (config/policy), the manager's RBAC
// (config/rbac). The manager runs in this process exactly as cmd/main.go
// runs it (internal/manager, from command-line flags), as its ServiceAccount
// identity, with the endpoint policy of a local cluster (--endpoint-allow=
// 127.0.0.1/32: the tests' Redis servers are on loopback). Backends are real
// redis-server processes and, for the attacks, small servers that speak
// other protocols or lie.
package hostile

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lockwarden/lockwarden/internal/manager"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// resync is the manager's --resync-period: how soon an orphaned lease is
// released at the latest, and how often status follows Redis.
const resync = 2 * time.Second

var (
	// env is the control plane; nil under -short.
	env *kubetest.Env
	// asOperator and asTenant are direct clients of the two identities.
	asOperator client.Client
	asTenant   client.Client
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test needs the control plane: they skip
	}
	level := zapcore.ErrorLevel
	if os.Getenv("LOCKWARDEN_TEST_LOG") != "" {
		level = zapcore.Level(-2)
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(level)))
	e, err := kubetest.StartEnv(kubetest.WithWebhooks())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	err = setUp(ctx, stopped)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "set up the hostile-tenant suite:", err)
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

// setUp installs lockwarden's RBAC and admission policy, makes both
// identities and starts the manager as the operator; stopped receives the
// manager's result once ctx ends.
func setUp(ctx context.Context, stopped chan<- error) error {
	if err := env.StartControllers(tenancytest.Controllers...); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := tenancytest.Install(sctx, env); err != nil {
		return err
	}
	operatorCfg, operator, err := tenancytest.User(env, tenancytest.OperatorUser, tenancytest.OperatorGroups...)
	if err != nil {
		return err
	}
	asOperator = operator
	if _, asTenant, err = tenancytest.User(env, tenancytest.TenantUser, tenancytest.TenantGroup); err != nil {
		return err
	}
	probePort, err := freeport.Take()
	if err != nil {
		return err
	}
	host, port, certDir := env.Webhook()
	o, err := manager.ParseFlags([]string{
		"--leader-elect",
		"--leader-election-namespace=" + tenancytest.OperatorNamespace,
		"--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort),
		"--webhook-cert-mode=external",
		"--webhook-cert-dir=" + certDir,
		"--webhook-host=" + host,
		fmt.Sprintf("--webhook-port=%d", port),
		"--cluster-name=hostile",
		"--resync-period=" + resync.String(),
		// A local cluster: the Redis servers are on loopback. Every other
		// loopback address (127.0.0.2, ...) stays denied.
		"--endpoint-allow=127.0.0.1/32",
	})
	if err != nil {
		return err
	}
	go func() { stopped <- manager.Run(ctx, operatorCfg, o) }()
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
