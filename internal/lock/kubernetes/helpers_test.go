package kubernetes

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// testNamespace holds the tests' Leases.
const testNamespace = "lockwarden-locks"

// env is the package's control plane (nil under -short).
var env *kubetest.Env

func TestMain(m *testing.M) {
	kubetest.MainEnv(m, "kubernetes store", func(e *kubetest.Env) (func(), error) {
		env = e
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}
		return nil, e.Client.Create(context.Background(), ns)
	})
}

// needEnv skips a test that needs the control plane under -short.
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd; skipped with -short")
	}
}

// clientFor returns a client of the API server at cfg.
func clientFor(t testing.TB, cfg *rest.Config) kubeclient.Interface {
	t.Helper()
	c, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// newTestLocker returns a Locker on the test namespace with prefix,
// closed when the test ends.
func newTestLocker(t testing.TB, cfg Config, opts ...Option) *Locker {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = clientFor(t, env.Config)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = testNamespace
	}
	l, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// lockerFactory returns the suites' newLocker: Lockers on one prefix, like
// operators sharing a cluster.
func lockerFactory(cfg Config, opts ...Option) func(t *testing.T) lock.Locker {
	return func(t *testing.T) lock.Locker { return newTestLocker(t, cfg, opts...) }
}

// createKeyLease creates key's Lease holding the state raw as it is, like
// a Locker of an older release would have written it.
func createKeyLease(t testing.TB, l *Locker, key, raw string) {
	t.Helper()
	obj := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:        l.leaseName(key),
		Labels:      map[string]string{LabelStore: l.store, LabelRole: roleKey},
		Annotations: map[string]string{AnnotationState: raw},
	}}
	if _, err := l.leases.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
