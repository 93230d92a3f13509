package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
)

// clusterBackendIDPrefix starts the backend ID of every ClusterLockBackend (backend.LockBackendID).
const clusterBackendIDPrefix = "ClusterLockBackend/"

// ClusterLockBackendReconciler shows in a ClusterLockBackend's status how
// many locks use it and whether it answers, as the health check of the
// client those locks share last found: what an administrator looks at first.
type ClusterLockBackendReconciler struct {
	Client   client.Client
	Registry *backend.Registry
	// Resync is how often the status is refreshed without an event.
	Resync time.Duration

	notify chan event.GenericEvent
}

// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=clusterlockbackends/status,verbs=get;update;patch

// Reconcile counts the backend's locks and reports its health.
func (r *ClusterLockBackendReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var b locksv1alpha1.ClusterLockBackend
	if err := r.Client.Get(ctx, req.NamespacedName, &b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var locks locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &locks, client.MatchingFields{indexBackend: clusterBackendIDPrefix + b.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list the locks of ClusterLockBackend %s: %w", b.Name, err)
	}
	st := b.Status.DeepCopy()
	st.Locks = int32(min(len(locks.Items), 1<<31-1))
	cond := metav1.Condition{Type: locksv1alpha1.ConditionReady, ObservedGeneration: b.Generation}
	inUse, err := r.Registry.HealthOf(clusterBackendIDPrefix + b.Name)
	switch invalid := backend.ValidateSelectors(&b); {
	case invalid != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonInvalidBackend, invalid.Error()+"; no lock can use the backend until it is fixed"
	case !inUse:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, locksv1alpha1.ReasonNotInUse, "No lock uses this backend here; its health is checked once one does"
	case errors.Is(err, backend.ErrConnecting):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, locksv1alpha1.ReasonConnecting, "The first health check has not answered yet"
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable, backend.Describe(err)
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, "Redis answers"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	if !equality.Semantic.DeepEqual(&b.Status, st) {
		before := b.DeepCopy()
		b.Status = *st
		if err := r.Client.Status().Patch(ctx, &b, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, fmt.Errorf("patch status of ClusterLockBackend %s: %w", b.Name, err)
		}
	}
	return ctrl.Result{RequeueAfter: r.Resync}, nil
}

// SetupWithManager registers the reconciler: it runs when a backend or a
// lock naming it changes, and when the backend's health changes.
func (r *ClusterLockBackendReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.notify = make(chan event.GenericEvent, notifyBuffer)
	r.Registry.OnHealth(func(id string, _ error) {
		if name, ok := strings.CutPrefix(id, clusterBackendIDPrefix); ok {
			b := &locksv1alpha1.ClusterLockBackend{}
			b.Name = name
			select {
			case r.notify <- event.GenericEvent{Object: b}:
			default: // the resync catches up
			}
		}
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.ClusterLockBackend{}).
		Watches(&locksv1alpha1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(clusterBackendOfLock)).
		WatchesRawSource(source.Channel(r.notify, &handler.EnqueueRequestForObject{})).
		Named("clusterlockbackend").
		Complete(r)
}

// clusterBackendOfLock maps a lock to the ClusterLockBackend it names.
func clusterBackendOfLock(_ context.Context, o client.Object) []reconcile.Request {
	dl, ok := o.(*locksv1alpha1.DistributedLock)
	if !ok || dl.Spec.Backend.ClusterBackendRef == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: dl.Spec.Backend.ClusterBackendRef.Name}}}
}
