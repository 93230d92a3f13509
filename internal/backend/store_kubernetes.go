package backend

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	kubelock "github.com/lockwarden/lockwarden/internal/lock/kubernetes"
)

// TypeKubernetes is status.type of a kubernetes store.
const TypeKubernetes = "Kubernetes"

// kubernetesQPS bounds the API calls of one kubernetes-store client (burst
// twice that), apart from the operator's own client: locks cannot starve
// the controllers of their API budget, nor the other way round.
const kubernetesQPS = 50

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
		rc := rest.CopyConfig(cl.Config)
		rc.QPS, rc.Burst = kubernetesQPS, 2*kubernetesQPS
		client, err := kubeclient.NewForConfig(rc)
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
