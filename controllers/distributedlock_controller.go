// Package controllers holds lockwarden's reconcilers: one per Kind.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
)

const (
	// DefaultResyncPeriod bounds how long a change made outside this operator
	// (a holder in another cluster) takes to show in status.
	DefaultResyncPeriod = 30 * time.Second
	// waitingRequeue is how often a queued manual holder refreshes its place
	// in the queue (well within the backend's waiter TTL) and tries again.
	waitingRequeue = 5 * time.Second
	// backendRetry is how soon a lock whose backend failed is tried again.
	backendRetry = 5 * time.Second

	lockKind = "DistributedLock"
)

// DistributedLockReconciler reconciles DistributedLock objects: it holds the
// lock for a manual holder and reports in status what the backend holds.
type DistributedLockReconciler struct {
	Deps
	LockOptions

	// tracker carries reconcile requests from the backend (releases, health)
	// and the watchdog (lost leases), and remembers waiting holders.
	*tracker
	// resync lists the locks the status resync keeps current.
	resync *resyncTable
	// rollouts are the Deployment rollouts the Pod reconciler found
	// waiting for a lock their own old Pods hold (RolloutBlocked).
	rollouts *rolloutMemory
	// budget bounds, per namespace, the reconciles of locks without a
	// held manual lease (see namespaceBudget); nil bounds nothing.
	budget *namespaceBudget

	mu sync.Mutex
	// warned remembers the generation a spec warning was last given for, so
	// that it is given once per change, not on every resync.
	warned map[warning]int64
	// holdEnded remembers the generation whose manual hold ended (its
	// until or maxHoldSeconds passed), so that a reconcile reading the lock
	// from a cache that does not show the HoldEnded condition yet does not
	// take the lock again.
	holdEnded map[types.NamespacedName]endedHold
}

// endedHold is a manual hold that ended: the lock's generation, and why.
type endedHold struct {
	generation int64
	why        string
}

type warning struct {
	nn     types.NamespacedName
	reason string
}

// warnOnce records a Warning event (action Validate) once per generation of the lock.
func (r *DistributedLockReconciler) warnOnce(dl *locksv1alpha1.DistributedLock, reason, note string, args ...any) {
	w := warning{nn: types.NamespacedName{Namespace: dl.Namespace, Name: dl.Name}, reason: reason}
	r.mu.Lock()
	done := r.warned[w] == dl.Generation
	r.warned[w] = dl.Generation
	r.mu.Unlock()
	if !done {
		r.Recorder.Eventf(dl, nil, corev1.EventTypeWarning, reason, "Validate", note, args...)
	}
}

// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=clusterlockbackends,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile holds or releases the lock for its manual holder and rebuilds its
// status from what the backend holds.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var dl locksv1alpha1.DistributedLock
	if err := r.Client.Get(ctx, req.NamespacedName, &dl); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone without the deletion reconcile (its finalizer was
			// removed): release a lease still renewed for it, and forget it.
			ref := holder.Ref{Kind: lockKind, Namespace: req.Namespace, Name: req.Name}
			releaseOrphan(ctx, r.Deps, ref, nil, "the DistributedLock is gone")
			r.dropLockState(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !dl.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &dl)
	}
	if terminating, err := r.namespaceTerminating(ctx, dl.Namespace); err != nil || terminating {
		if err != nil {
			return ctrl.Result{}, err
		}
		// The namespace is being deleted. The namespace controller deletes
		// its locks with one DeleteCollection at a time, which lists them
		// all and then deletes them one by one; at tens of thousands of
		// locks each call times out after a minute and is retried with
		// backoff. Deleting them from here, as many at once as there are
		// workers, ends the namespace in minutes. The lease is released and
		// the finalizer dropped first, as for any deleted lock, so that the
		// DELETE removes the lock at once: one pass and one write less per
		// lock than a DELETE whose finalizer runs afterwards.
		if res, err := r.reconcileDelete(ctx, &dl); err != nil || !res.IsZero() {
			return res, err
		}
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, &dl, client.Preconditions{UID: &dl.UID}))
	}
	// A lock whose manual holder holds (or held, and has just lost) its
	// lease shows that at once: never put back.
	_, _, held := r.Watchdog.Holding(holder.Ref{Kind: lockKind, Namespace: dl.Namespace, Name: dl.Name})
	if !held && (dl.Spec.Holder == nil || dl.Status.Holder == nil) {
		if res, ok := withinBudget(ctx, r.budget, lockKind, req.NamespacedName, r.Clock.Now()); !ok {
			return res, nil
		}
	}
	if controllerutil.AddFinalizer(&dl, locksv1alpha1.Finalizer) {
		// The update event brings the lock back. A lock deleted meanwhile
		// (its finalizer stripped) is forgotten by the reconcile that finds
		// it gone.
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, &dl))
	}

	obs := r.gather(ctx, &dl)
	defer obs.done()
	if errors.Is(obs.backendErr, backend.ErrBusy) {
		// Its other reconciles hold the backend's share of the workers.
		return ctrl.Result{RequeueAfter: busyRequeue()}, nil
	}
	if errors.Is(obs.backendErr, backend.ErrConnecting) {
		// The backend is new: its first health check wakes the lock in a
		// moment (OnHealth), with no status write in between.
		return ctrl.Result{RequeueAfter: connectingRequeue}, nil
	}
	if err := r.forceRelease(ctx, &dl, obs); err != nil {
		return ctrl.Result{}, err
	}
	obs.holds = observeHolds(&dl, obs.now)
	holdWindowEvents(&dl, obs)
	if obs.ready() {
		// Bring the backend in line with spec.holder; what happened is
		// recorded in obs.
		r.reconcileHolder(ctx, &dl, obs)
	} else {
		// The policy refuses the backend now, or it is down: nothing new is
		// acquired, but a lease no longer wanted is still let go.
		r.releaseUnwanted(ctx, &dl, obs)
	}
	status := computeStatus(&dl, obs, r.ClusterName)
	holderChanged := holderOf(dl.Status) != holderOf(status)
	if err := r.patchStatus(ctx, &dl, status); err != nil {
		return ctrl.Result{}, err
	}
	r.track(req.NamespacedName, obs)
	r.report(&dl, obs)
	if holderChanged && obs.handle.Locker != nil {
		// Stores announce releases, not acquisitions: the other locks on
		// these keys (scope Global, or a second lock on the same keys) learn
		// of the new holder from here, not at their next resync.
		for _, key := range obs.keys {
			r.enqueueIndexed(indexBackendKey, backendKeyValues(obs.handle.ID, key)[0])
		}
	}
	return ctrl.Result{RequeueAfter: r.requeueAfter(obs)}, nil
}

// holderOf identifies the holder a status shows: identity and fencing token.
func holderOf(st locksv1alpha1.DistributedLockStatus) string {
	if st.Holder == nil {
		return ""
	}
	return fmt.Sprintf("%s@%d", st.Holder.Identity, st.FencingToken)
}

// patchStatus writes status only when something a user can see changed.
func (r *DistributedLockReconciler) patchStatus(ctx context.Context, dl *locksv1alpha1.DistributedLock, status locksv1alpha1.DistributedLockStatus) error {
	if equality.Semantic.DeepEqual(dl.Status, status) {
		return nil
	}
	before := dl.DeepCopy()
	dl.Status = status
	if err := r.Client.Status().Patch(ctx, dl, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patch status of %s: %w", client.ObjectKeyFromObject(dl), err)
	}
	logf.FromContext(ctx).V(1).Info("Updated status", "fencingToken", status.FencingToken)
	return nil
}

// track hands the lock to the status resync when this reconcile read its
// backend: the resync then notices changes made outside this operator. A
// lock whose backend could not be used is left to its own requeue and to
// the backend's recovery (OnHealth).
func (r *DistributedLockReconciler) track(nn types.NamespacedName, obs *observation) {
	if !obs.ready() || obs.handle.Locker == nil || obs.states == nil {
		r.resync.drop(nn)
		return
	}
	r.resync.set(nn, resyncEntry{locker: obs.handle.Locker, keys: obs.keys, digest: stateDigest(obs.states)})
}

// requeueAfter is when the lock must be looked at again without an event: 0
// when nothing is pending. Changes made outside this operator (a holder in
// another cluster) are found by the status resync, releases announced by
// the backend, health changes by OnHealth.
func (r *DistributedLockReconciler) requeueAfter(obs *observation) time.Duration {
	after := r.requeueFor(obs)
	if at := obs.holdWake(); !at.IsZero() && obs.scopeDenied == "" {
		// A hold window opens or closes, a cooldown ends: be there.
		if d := max(at.Sub(obs.now), time.Millisecond); after == 0 || d < after {
			after = d
		}
	}
	return after
}

// requeueFor is requeueAfter without the holds and the cooldown.
func (r *DistributedLockReconciler) requeueFor(obs *observation) time.Duration {
	switch {
	case obs.scopeDenied != "":
		return 0 // a namespace label or backend change brings it back
	case errors.As(obs.backendErr, new(*backend.PolicyError)):
		return r.Resync // a namespace label or backend change brings it back sooner
	case obs.knownDown:
		// The backend's recovery brings it back (OnHealth): retrying sooner
		// would only cost the shared workers, once per lock.
		return r.Resync
	case obs.backendErr != nil:
		return backendRetry
	case obs.waiting:
		return waitingRequeue
	case !obs.holdEnds.IsZero():
		// A bounded manual hold: be there when it ends.
		return max(obs.holdEnds.Sub(obs.now), time.Millisecond)
	case obs.rolloutBlocked != "":
		// Shown until no waiting Pod finds the rollout blocked: be there
		// when that ends, to clear RolloutBlocked.
		return rolloutBlockedFor + time.Second
	default:
		return 0
	}
}

// Enqueue asks for a reconcile of one lock from outside the informers, for
// example when a Job joins its queue.
func (r *DistributedLockReconciler) Enqueue(nn types.NamespacedName) { r.enqueue(nn) }

// enqueueIndexed enqueues every lock that the index maps value to.
func (r *DistributedLockReconciler) enqueueIndexed(index, value string) {
	var list locksv1alpha1.DistributedLockList
	if err := r.Client.List(context.Background(), &list, client.MatchingFields{index: value}); err != nil {
		// Only the prompt wake-up is missed: the resync brings the locks back.
		r.Log.Error(err, "Listing the locks of a backend event failed; their status catches up at the next resync", "index", index)
		return
	}
	for i := range list.Items {
		r.enqueue(client.ObjectKeyFromObject(&list.Items[i]))
	}
}

// SetupWithManager registers the reconciler, its indexes and its event sources.
func (r *DistributedLockReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Registry.OnRelease(func(backendID, key string) {
		r.enqueueIndexed(indexBackendKey, backendKeyValues(backendID, key)[0])
		if prefix, ok := backend.ScopePrefix(key); ok {
			// The locks that derive keys in the key's scope.
			r.enqueueIndexed(indexBackendKey, backendKeyValues(backendID, prefix)[0])
		}
	})
	r.Registry.OnHealth(func(backendID string, _ error) { r.enqueueIndexed(indexBackend, backendID) })

	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1alpha1.DistributedLock{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, finalizerChanged{}))).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.locksInNamespace),
			builder.WithPredicates(predicate.Or[client.Object](predicate.LabelChangedPredicate{}, namespaceDeleted{}))).
		// A changed backend object (endpoints, credentials, selectors) changes its locks.
		Watches(&locksv1alpha1.ClusterLockBackend{}, handler.EnqueueRequestsFromMapFunc(r.locksOfBackend)).
		Watches(&locksv1alpha1.LockBackend{}, handler.EnqueueRequestsFromMapFunc(r.locksOfBackend)).
		// A gated Job that starts, waits or finishes changes what its lock's status shows.
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(lockOfJob)).
		WatchesRawSource(r.source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Workers}).
		Named("distributedlock").
		Complete(r)
}

// lockOfJob maps a gated Job to its lock.
func lockOfJob(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[locksv1alpha1.LabelLock]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// locksInNamespace maps a Namespace to the locks whose policy depends on its
// labels: Global locks, and locks on a ClusterLockBackend (its namespace
// selectors); to all of its locks once it is being deleted.
func (r *DistributedLockReconciler) locksInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	var list locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetName())); err != nil {
		r.Log.Error(err, "Listing the locks of a relabelled namespace failed; they catch up at the next resync", "namespace", o.GetName())
		return nil
	}
	deleted := !o.GetDeletionTimestamp().IsZero()
	var out []reconcile.Request
	for i := range list.Items {
		if dl := &list.Items[i]; deleted || dl.Spec.Scope == locksv1alpha1.ScopeGlobal || dl.Spec.Backend.ClusterBackendRef != nil {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// locksOfBackend maps a ClusterLockBackend or LockBackend to the locks that name it.
func (r *DistributedLockReconciler) locksOfBackend(ctx context.Context, o client.Object) []reconcile.Request {
	id := clusterBackendIDPrefix + o.GetName()
	if o.GetNamespace() != "" {
		id = backend.NamespacedBackendID(o.GetNamespace(), o.GetName())
	}
	var list locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexBackend: id}); err != nil {
		r.Log.Error(err, "Listing the locks of a changed backend failed; they catch up at the next resync", "backend", id)
		return nil
	}
	out := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		out[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return out
}

// namespaceTerminating tells whether namespace ns is being deleted, from the
// cache. A namespace the cache does not have yet is not: the informers of
// namespaces and of locks are independent, so a lock in a namespace created
// a moment ago may arrive first. A deletion, once started, is never undone.
func (r *DistributedLockReconciler) namespaceTerminating(ctx context.Context, ns string) (bool, error) {
	var n corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return !n.DeletionTimestamp.IsZero(), nil
}

// namespaceDeleted passes a Namespace whose deletion started (and, at
// startup, one that is being deleted already).
type namespaceDeleted struct{ predicate.Funcs }

// Create passes a namespace that is being deleted.
func (namespaceDeleted) Create(e event.CreateEvent) bool {
	return e.Object != nil && !e.Object.GetDeletionTimestamp().IsZero()
}

// Update passes when the deletion timestamp appears.
func (namespaceDeleted) Update(e event.UpdateEvent) bool {
	return e.ObjectOld != nil && e.ObjectNew != nil &&
		e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
}

// Delete and Generic pass nothing: the locks of a namespace that is gone are gone too.
func (namespaceDeleted) Delete(event.DeleteEvent) bool { return false }

// Generic passes nothing.
func (namespaceDeleted) Generic(event.GenericEvent) bool { return false }

// finalizerChanged lets updates through that change the finalizers or start a deletion.
type finalizerChanged struct{ predicate.Funcs }

// Update passes when finalizers or the deletion timestamp changed.
func (finalizerChanged) Update(e event.UpdateEvent) bool {
	if e.ObjectOld == nil || e.ObjectNew == nil {
		return false
	}
	return !equality.Semantic.DeepEqual(e.ObjectOld.GetFinalizers(), e.ObjectNew.GetFinalizers()) ||
		!e.ObjectOld.GetDeletionTimestamp().Equal(e.ObjectNew.GetDeletionTimestamp())
}
