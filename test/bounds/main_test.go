// Package bounds checks, against kube-controller-manager's real Job
// controller, how lockwarden ends a gated Job that must not run (contention
// Skip, a maximum wait that passed, a newer Job of its CronJob with
// contention QueueLatest): lockwarden marks the suspended Job with a
// FailureTarget condition with its reason, and the Job controller turns
// that into Failed with the same reason, without ever creating a Pod. It
// also checks that a deleted holder keeps its lock until its pods stop.
//
// The cluster is a real kube-apiserver and etcd (envtest) with lockwarden's
// webhook configuration, plus kube-controller-manager running only the Job
// controller and the garbage collector (no scheduler and no kubelet: a Pod
// the Job controller creates stays Pending, which is enough to see that it
// was created). The manager runs in this process as cmd/main.go runs it
// (internal/manager, from command-line flags), as an administrator: this
// suite is about the Job's lifecycle, not RBAC (test/hostile runs the
// manager as its ServiceAccount).
package bounds

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
)

// Names of kube-controller-manager's controllers: the Job controller, and
// the garbage collector (which deletes or orphans the pods of a deleted Job).
const (
	jobController    = "job-controller"
	garbageCollector = "garbage-collector-controller"
)

// operatorNamespace is where the manager keeps its owner key.
const operatorNamespace = "lockwarden-system"

// env is the control plane; nil under -short.
var env *kubetest.Env

func TestMain(m *testing.M) {
	kubetest.Main(m, "bounds", func(ctx context.Context, e *kubetest.Env, stopped chan<- error) error {
		env = e
		return setUp(ctx, stopped)
	}, kubetest.WithWebhooks())
}

// setUp starts kube-controller-manager's Job controller and the manager;
// stopped receives the manager's result once ctx ends.
func setUp(ctx context.Context, stopped chan<- error) error {
	if err := env.StartControllers(jobController, garbageCollector); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := env.Client.Create(sctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		return err
	}
	return managertest.Start(ctx, env, env.Config, []string{
		"--leader-election-namespace=" + operatorNamespace,
		"--metrics-bind-address=0",
		"--cluster-name=bounds",
		"--endpoint-allow=127.0.0.1/32", // the tests' Redis servers are on loopback
	}, stopped)
}
