package backend

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
)

// TypeKubernetes is status.type of a kubernetes store.
const TypeKubernetes = "Kubernetes"

// kubernetesQPS bounds the API calls of the kubernetes store (burst twice
// that), apart from the operator's own client: locks cannot starve the
// controllers of their API budget, nor the other way round. Every backend
// on the store shares the one client (kubernetesClients), so that a
// namespace cannot multiply the budget by making LockBackends.
const kubernetesQPS = 50

// kubernetesClients holds the kubernetes store's client of each cluster
// configuration (one per operator), by *rest.Config.
var kubernetesClients sync.Map

// kubernetesClient returns the store's client for cfg, made once.
func kubernetesClient(cfg *rest.Config) (kubeclient.Interface, error) {
	if c, ok := kubernetesClients.Load(cfg); ok {
		return c.(kubeclient.Interface), nil
	}
	rc := rest.CopyConfig(cfg)
	rc.QPS, rc.Burst = kubernetesQPS, 2*kubernetesQPS
	c, err := kubeclient.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	actual, _ := kubernetesClients.LoadOrStore(cfg, c)
	return actual.(kubeclient.Interface), nil
}

// The kubernetes store writes Leases in the operator's namespace only: the
// leader-election Role (config/rbac) grants what it needs, and nothing
// beyond that namespace.
var kubernetesStore = storeKind{
	field: "kubernetes", typ: TypeKubernetes,
	set:           func(s Spec) bool { return s.Kubernetes != nil },
	endpoints:     func(Spec) []string { return nil },
	endpointField: endpointsField,
	summary: func(s Spec, _ string) string {
		return "Leases " + orDefault(s.Kubernetes.Prefix, kubelock.DefaultPrefix) + "/*"
	},
	normalize: func(s Spec, out *Spec) { out.Kubernetes = s.Kubernetes.DeepCopy() },
	newLocker: func(cfg Config, log logr.Logger) (Locker, error) {
		opts := []kubelock.Option{kubelock.WithLogger(log)}
		if cfg.OperationTimeout > 0 {
			opts = append(opts, kubelock.WithOpTimeout(cfg.OperationTimeout))
		}
		return kubelock.New(*cfg.Engine.(*kubelock.Config), opts...)
	},
	resolve: func(_ context.Context, r *Registry, src *source, _ dialFunc) (any, []string, string, error) {
		cl := r.cluster
		if cl.Config == nil || cl.Namespace == "" {
			return nil, nil, "", &ConfigError{Field: src.field, Err: fmt.Errorf("this operator was started without the cluster it runs in, so it cannot keep locks in it; use another store")}
		}
		client, err := kubernetesClient(cl.Config)
		if err != nil {
			return nil, nil, "", &ConfigError{Field: src.field, Err: err}
		}
		c := kubelock.Config{Client: client, Namespace: cl.Namespace, Prefix: orDefault(src.spec.Kubernetes.Prefix, kubelock.DefaultPrefix), Identity: cl.Identity, Scopes: slices.Clone(src.scopes)}
		if err := engineConfig(src.field, c.Validate); err != nil {
			return nil, nil, "", err
		}
		return &c, nil, "", nil
	},
}
