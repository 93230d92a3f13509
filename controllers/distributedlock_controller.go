// Package controllers holds lockwarden's reconcilers: one per Kind.
package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// backendCheckInterval is how often a lock's backend is checked while nothing else happens.
const backendCheckInterval = 10 * time.Second

// backendPingTimeout bounds one reachability check of a lock's Redis.
const backendPingTimeout = 2 * time.Second

// DistributedLockReconciler reconciles DistributedLock objects.
type DistributedLockReconciler struct {
	client.Client
	// APIReader reads Secrets straight from the API server, so the manager
	// needs neither list nor watch on Secrets cluster-wide.
	APIReader client.Reader
}

// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile checks that the lock's backend answers and records it in the
// BackendReady condition.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	var dl locksv1alpha1.DistributedLock
	if err := r.Get(ctx, req.NamespacedName, &dl); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	cond := r.backendCondition(ctx, &dl)
	before := dl.DeepCopy()
	meta.SetStatusCondition(&dl.Status.Conditions, cond)
	dl.Status.ObservedGeneration = dl.Generation
	if !equalStatus(before.Status, dl.Status) {
		if err := r.Status().Patch(ctx, &dl, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, fmt.Errorf("patch status of %s: %w", req.NamespacedName, err)
		}
		log.Info("Updated backend condition", "status", cond.Status, "reason", cond.Reason)
	}
	return ctrl.Result{RequeueAfter: backendCheckInterval}, nil
}

// backendCondition pings the lock's Redis and returns the BackendReady condition.
func (r *DistributedLockReconciler) backendCondition(ctx context.Context, dl *locksv1alpha1.DistributedLock) metav1.Condition {
	cond := metav1.Condition{Type: locksv1alpha1.ConditionBackendReady, ObservedGeneration: dl.Generation}
	rb := dl.Spec.Backend.Redis
	if rb == nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonInvalidBackend, "spec.backend.redis is required"
		return cond
	}
	password := ""
	if ref := rb.PasswordSecretRef; ref != nil {
		var secret corev1.Secret
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: dl.Namespace, Name: ref.Name}, &secret); err != nil {
			cond.Status, cond.Reason = metav1.ConditionFalse, locksv1alpha1.ReasonSecretNotFound
			if apierrors.IsNotFound(err) {
				cond.Message = fmt.Sprintf("spec.backend.redis.passwordSecretRef: Secret %s/%s not found", dl.Namespace, ref.Name)
			} else {
				cond.Message = fmt.Sprintf("spec.backend.redis.passwordSecretRef: reading Secret %s/%s: %v", dl.Namespace, ref.Name, err)
			}
			return cond
		}
		v, ok := secret.Data[ref.Key]
		if !ok {
			cond.Status, cond.Reason = metav1.ConditionFalse, locksv1alpha1.ReasonSecretNotFound
			cond.Message = fmt.Sprintf("spec.backend.redis.passwordSecretRef: Secret %s/%s has no key %q", dl.Namespace, ref.Name, ref.Key)
			return cond
		}
		password = string(v)
	}
	c := redis.NewClient(&redis.Options{Addr: rb.Endpoints[0], Password: password, DB: int(rb.DB), MaxRetries: -1})
	defer func() { _ = c.Close() }()
	pingCtx, cancel := context.WithTimeout(ctx, backendPingTimeout)
	defer cancel()
	if err := c.Ping(pingCtx).Err(); err != nil {
		cond.Status, cond.Reason = metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable
		cond.Message = fmt.Sprintf("Redis %s: %v", rb.Endpoints[0], err)
		return cond
	}
	cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, fmt.Sprintf("Redis %s answers", rb.Endpoints[0])
	return cond
}

// equalStatus reports whether two statuses would look the same to a user.
func equalStatus(a, b locksv1alpha1.DistributedLockStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range a.Conditions {
		o := meta.FindStatusCondition(b.Conditions, c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message || o.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}

// SetupWithManager registers the reconciler with the manager.
func (r *DistributedLockReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.DistributedLock{}).
		Named("distributedlock").
		Complete(r)
}
