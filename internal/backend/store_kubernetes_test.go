package backend

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
)

// TestResolveKubernetesStore: a LockBackend on the kubernetes store keeps
// its Leases in the operator's namespace, with the backend's prefix, and
// may use only its namespace's keys; an operator that was not told its
// cluster refuses the store by field rather than failing later.
func TestResolveKubernetesStore(t *testing.T) {
	t.Parallel()
	objs := []client.Object{storeLockBackend("kube", locksv1alpha1.LockBackendSpec{
		Store: locksv1alpha1.Store{Kubernetes: &locksv1alpha1.KubernetesBackend{Prefix: "team-a-locks"}},
	})}
	r := registryWith(t, deepCopies(objs)...)
	r.SetPolicy(Policy{}, nil)
	_, _, err := r.resolveAny(t.Context(), lockOnBackend("kube"))
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "spec.kubernetes: this operator was started without the cluster") {
		t.Fatalf("resolve without the cluster: %v, want a ConfigError naming spec.kubernetes", err)
	}

	r = registryWith(t, deepCopies(objs)...)
	r.SetPolicy(Policy{}, nil)
	r.SetCluster(Cluster{Config: &rest.Config{Host: "https://127.0.0.1:6443"}, Namespace: "lockwarden-system", Identity: "lockwarden-abc"})
	cfg, _, err := r.resolveAny(t.Context(), lockOnBackend("kube"))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := cfg.Engine.(*kubelock.Config)
	if k == nil || k.Client == nil || k.Namespace != "lockwarden-system" || k.Prefix != "team-a-locks" || k.Identity != "lockwarden-abc" ||
		!slices.Equal(k.Scopes, []string{EngineKey("team-a", locksv1alpha1.ScopeNamespace, "")}) || len(cfg.Endpoints) != 0 {
		t.Fatalf("kubernetes config = %+v (endpoints %q)", cfg.Engine, cfg.Endpoints)
	}
	if s := NamespacedSpec(objs[0].(*locksv1alpha1.LockBackend)); s.Type() != TypeKubernetes || s.Validate() != nil || s.Summary() != "Leases team-a-locks/*" {
		t.Fatalf("spec: type %q, validate %v, summary %q", s.Type(), s.Validate(), s.Summary())
	}
}

// TestKubernetesBackendsShareOneClient: every backend on the kubernetes
// store of one operator uses the same client, and so the same request
// budget: a namespace that makes LockBackends with other prefixes gets no
// more of the API server.
func TestKubernetesBackendsShareOneClient(t *testing.T) {
	t.Parallel()
	objs := []client.Object{
		storeLockBackend("one", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Kubernetes: &locksv1alpha1.KubernetesBackend{Prefix: "one"}}}),
		storeLockBackend("two", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Kubernetes: &locksv1alpha1.KubernetesBackend{Prefix: "two"}}}),
	}
	r := registryWith(t, deepCopies(objs)...)
	r.SetPolicy(Policy{}, nil)
	r.SetCluster(Cluster{Config: &rest.Config{Host: "https://127.0.0.1:6443"}, Namespace: "lockwarden-system"})
	var clients []any
	for _, name := range []string{"one", "two"} {
		cfg, fp, err := r.resolveAny(t.Context(), lockOnBackend(name))
		if err != nil {
			t.Fatal(err)
		}
		if fp == "" {
			t.Fatal("no fingerprint")
		}
		clients = append(clients, cfg.Engine.(*kubelock.Config).Client)
	}
	if clients[0] != clients[1] {
		t.Fatal("two backends on the kubernetes store got two clients (two request budgets)")
	}
}
