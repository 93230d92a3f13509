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
// 127.0.0.1/32: the tests' Redis servers are on loopback; and 10.0.0.0/8, a
// pod network where nothing listens). Backends are real
// redis-server processes and, for the attacks, small servers that speak
// other protocols or lie.
package hostile

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// resync is the manager's --resync-period: how soon an orphaned lease is
// released at the latest, and how often status follows Redis.
const resync = 2 * time.Second

// denyRefresh is the manager's --endpoint-deny-refresh: how soon it denies
// an address the operator's namespace starts using.
const denyRefresh = time.Second

var (
	// env is the control plane; nil under -short.
	env *kubetest.Env
	// asOperator and asTenant are direct clients of the two identities.
	asOperator client.Client
	asTenant   client.Client
)

func TestMain(m *testing.M) {
	kubetest.Main(m, "hostile-tenant", func(ctx context.Context, e *kubetest.Env, stopped chan<- error) error {
		env = e
		return setUp(ctx, stopped)
	}, kubetest.WithWebhooks())
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
	return managertest.Start(ctx, env, operatorCfg, []string{
		"--leader-elect",
		"--leader-election-namespace=" + tenancytest.OperatorNamespace,
		"--metrics-bind-address=0",
		"--cluster-name=hostile",
		"--resync-period=" + resync.String(),
		"--endpoint-deny-refresh=" + denyRefresh.String(),
		// A local cluster: the Redis servers are on loopback. Every other
		// loopback address (127.0.0.2, ...) stays denied. 10.0.0.0/8 stands
		// for a pod network, where the operator's own addresses are denied
		// as they appear; nothing listens there.
		"--endpoint-allow=127.0.0.1/32,10.0.0.0/8",
	}, stopped)
}
