package manager

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// DefaultClusterLockBackend is the name of the ClusterLockBackend the
// operator creates on the kubernetes store unless told otherwise
// (--default-cluster-lock-backend): locks can name it, in every namespace,
// with no store to install.
const DefaultClusterLockBackend = "kubernetes"

// AnnotationCreatedBy marks the default ClusterLockBackend as the
// operator's: it creates it when missing, and never changes it after.
const AnnotationCreatedBy = "lockwarden.io/created-by"

// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=clusterlockbackends,verbs=create

// defaultBackend creates the default ClusterLockBackend when it is missing,
// once, on the leader. An administrator may change it (its namespace
// selector, say) or delete it: the operator does not put it back until it
// restarts; --default-cluster-lock-backend="" stops it for good.
type defaultBackend struct {
	c    client.Client
	name string
	log  logr.Logger
}

// NeedLeaderElection: only the leader creates it.
func (d *defaultBackend) NeedLeaderElection() bool { return true }

// Start creates the backend, retrying with backoff while the API server
// refuses (other than AlreadyExists), until ctx ends.
func (d *defaultBackend) Start(ctx context.Context) error {
	b := DefaultBackendObject(d.name)
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Minute}, func(ctx context.Context) (bool, error) {
		err := d.c.Create(ctx, b.DeepCopy())
		switch {
		case err == nil:
			d.log.Info("Created the default ClusterLockBackend on the kubernetes store; locks in every namespace may name it", "name", d.name)
			return true, nil
		case apierrors.IsAlreadyExists(err):
			return true, nil
		default:
			d.log.Error(err, "Creating the default ClusterLockBackend failed; retrying", "name", d.name)
			return false, nil
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("create the default ClusterLockBackend %s: %w", d.name, err)
	}
	return nil
}

// DefaultBackendObject is the default ClusterLockBackend named name: the
// kubernetes store, every namespace, no Global scope.
func DefaultBackendObject(name string) *locksv1alpha1.ClusterLockBackend {
	return &locksv1alpha1.ClusterLockBackend{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "lockwarden"},
			Annotations: map[string]string{AnnotationCreatedBy: "lockwarden --default-cluster-lock-backend: created when missing, never changed; edit or delete it freely, and set the flag to \"\" to keep it deleted"},
		},
		Spec: locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Kubernetes: &locksv1alpha1.KubernetesBackend{}},
			NamespaceSelector: &metav1.LabelSelector{},
		},
	}
}

// checkDefaultBackendName checks --default-cluster-lock-backend.
func checkDefaultBackendName(name string) error {
	if name == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("--default-cluster-lock-backend %q is not a valid object name: %v (empty: create none)", name, errs)
	}
	return nil
}
