package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// clusterBackendIDPrefix starts the backend ID of every ClusterLockBackend (backend.LockBackendID).
const clusterBackendIDPrefix = "ClusterLockBackend/"

// namespacedBackendIDPrefix starts the backend ID of every LockBackend.
const namespacedBackendIDPrefix = "LockBackend/"

// BackendStatusReconciler shows in a ClusterLockBackend's or LockBackend's
// status how many locks use it and whether it answers, as the health check
// of the client those locks share last found (no connection of its own),
// and, for Redis, whether a server has a setting that makes leases unsafe
// (the StoreConfigured condition, with an Event per change): what an
// administrator, or a namespace's owners, look at first. One runs
// per Kind; build them with NewClusterLockBackendReconciler and
// NewLockBackendReconciler.
type BackendStatusReconciler struct {
	Client   client.Client
	Registry *backend.Registry
	// Resync is how often the status is refreshed without an event.
	Resync time.Duration
	// Recorder records the Events of the StoreConfigured condition on the
	// backend (default: the manager's, set by SetupWithManager).
	Recorder events.EventRecorder

	kind     string
	newObj   func() client.Object
	idOf     func(client.Object) string
	statusOf func(client.Object) *locksv1alpha1.BackendStatus
	// validate says why the backend cannot be used at all (nil: it can).
	validate func(client.Object) error
	// specOf is the store the backend names.
	specOf func(client.Object) backend.Spec
	// backendOfLock maps a lock to the backend of this Kind it names.
	backendOfLock func(*locksv1alpha1.DistributedLock) (types.NamespacedName, bool)
	// fromID maps a backend ID to the backend of this Kind it names.
	fromID func(id string) (types.NamespacedName, bool)

	notify chan event.GenericEvent
}

// NewClusterLockBackendReconciler reports ClusterLockBackends' use and health.
func NewClusterLockBackendReconciler(c client.Client, registry *backend.Registry, resync time.Duration) *BackendStatusReconciler {
	return &BackendStatusReconciler{
		Client: c, Registry: registry, Resync: resync, kind: "clusterlockbackend",
		newObj: func() client.Object { return &locksv1alpha1.ClusterLockBackend{} },
		idOf:   func(o client.Object) string { return clusterBackendIDPrefix + o.GetName() },
		statusOf: func(o client.Object) *locksv1alpha1.BackendStatus {
			return &o.(*locksv1alpha1.ClusterLockBackend).Status
		},
		validate: func(o client.Object) error {
			b := o.(*locksv1alpha1.ClusterLockBackend)
			if err := backend.ClusterSpec(b).Validate(); err != nil {
				return err
			}
			return backend.ValidateSelectors(b)
		},
		specOf: func(o client.Object) backend.Spec { return backend.ClusterSpec(o.(*locksv1alpha1.ClusterLockBackend)) },
		backendOfLock: func(dl *locksv1alpha1.DistributedLock) (types.NamespacedName, bool) {
			if ref := dl.Spec.Backend.ClusterBackendRef; ref != nil {
				return types.NamespacedName{Name: ref.Name}, true
			}
			return types.NamespacedName{}, false
		},
		fromID: func(id string) (types.NamespacedName, bool) {
			name, ok := strings.CutPrefix(id, clusterBackendIDPrefix)
			return types.NamespacedName{Name: name}, ok
		},
	}
}

// NewLockBackendReconciler reports LockBackends' use and health.
func NewLockBackendReconciler(c client.Client, registry *backend.Registry, resync time.Duration) *BackendStatusReconciler {
	return &BackendStatusReconciler{
		Client: c, Registry: registry, Resync: resync, kind: "lockbackend",
		newObj:   func() client.Object { return &locksv1alpha1.LockBackend{} },
		idOf:     func(o client.Object) string { return backend.NamespacedBackendID(o.GetNamespace(), o.GetName()) },
		statusOf: func(o client.Object) *locksv1alpha1.BackendStatus { return &o.(*locksv1alpha1.LockBackend).Status },
		validate: func(o client.Object) error { return backend.NamespacedSpec(o.(*locksv1alpha1.LockBackend)).Validate() },
		specOf:   func(o client.Object) backend.Spec { return backend.NamespacedSpec(o.(*locksv1alpha1.LockBackend)) },
		backendOfLock: func(dl *locksv1alpha1.DistributedLock) (types.NamespacedName, bool) {
			if ref := dl.Spec.Backend.BackendRef; ref != nil {
				return types.NamespacedName{Namespace: dl.Namespace, Name: ref.Name}, true
			}
			return types.NamespacedName{}, false
		},
		fromID: func(id string) (types.NamespacedName, bool) {
			rest, ok := strings.CutPrefix(id, namespacedBackendIDPrefix)
			ns, name, found := strings.Cut(rest, "/")
			return types.NamespacedName{Namespace: ns, Name: name}, ok && found
		},
	}
}

// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=clusterlockbackends/status;lockbackends/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.lockwarden.io,resources=lockbackends,verbs=get;list;watch

// Reconcile counts the backend's locks and reports its health.
func (r *BackendStatusReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.newObj()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	id := r.idOf(obj)
	var locks locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &locks, client.MatchingFields{indexBackend: id}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list the locks of %s: %w", id, err)
	}
	before := obj.DeepCopyObject().(client.Object)
	st := r.statusOf(obj)
	st.Locks = int32(min(len(locks.Items), 1<<31-1))
	spec := r.specOf(obj)
	st.Type, st.Endpoints = spec.Type(), spec.Summary()
	cond := metav1.Condition{Type: locksv1alpha1.ConditionReady, ObservedGeneration: obj.GetGeneration()}
	inUse, err := r.Registry.HealthOf(id)
	switch invalid := r.validate(obj); {
	case invalid != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonInvalidBackend, invalid.Error()+"; no lock can use the backend until it is fixed"
	case !inUse:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, locksv1alpha1.ReasonNotInUse, "No lock uses this backend here; its health is checked once one does"
	case errors.Is(err, backend.ErrConnecting):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, locksv1alpha1.ReasonConnecting, "The first health check has not answered yet"
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable, backend.Describe(err)
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, spec.Type()+" answers"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	notes := r.setConfigured(st, obj.GetGeneration(), cond.Reason != locksv1alpha1.ReasonInvalidBackend && inUse, id, spec.Type())
	if !equality.Semantic.DeepEqual(r.statusOf(before), st) {
		// With the resourceVersion: a reconcile that read a cache older than
		// this reconciler's own last write would otherwise write the same
		// change again, and tell its Events twice.
		if err := r.Client.Status().Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil // the cache catches up
			}
			return ctrl.Result{}, fmt.Errorf("patch status of %s: %w", id, err)
		}
		// Only once the condition is written: each change is told once,
		// not at every resync.
		for _, n := range notes {
			r.Recorder.Eventf(obj, nil, n.kind, n.reason, "CheckSettings", "%s", n.note)
		}
	}
	return ctrl.Result{RequeueAfter: r.Resync}, nil
}

// settingEvent is an Event to record once the status is written.
type settingEvent struct{ kind, reason, note string }

// setConfigured sets the StoreConfigured condition from the last settings
// check of the backend's servers (Registry.ConfigOf), or removes it when
// there is none (a store that does not check, a backend not in use or not
// usable, no check completed yet). It returns the Events the change calls
// for: a Warning for each unsafe setting the condition did not already
// name, and a Normal one when the last unsafe setting is gone.
func (r *BackendStatusReconciler) setConfigured(st *locksv1alpha1.BackendStatus, generation int64, usable bool, id, storeType string) []settingEvent {
	var old *metav1.Condition
	if c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionStoreConfigured); c != nil {
		old = c.DeepCopy()
	}
	checked, findings := false, []lock.Finding(nil)
	if usable {
		checked, findings = r.Registry.ConfigOf(id)
	}
	if !checked {
		meta.RemoveStatusCondition(&st.Conditions, locksv1alpha1.ConditionStoreConfigured)
		return nil
	}
	cond := metav1.Condition{Type: locksv1alpha1.ConditionStoreConfigured, ObservedGeneration: generation}
	var notes []settingEvent
	if len(findings) == 0 {
		cond.Status, cond.Reason = metav1.ConditionTrue, locksv1alpha1.ReasonNoUnsafeSetting
		cond.Message = "No " + storeType + " server has a setting known to make leases unsafe"
		if old != nil && old.Status == metav1.ConditionFalse {
			notes = append(notes, settingEvent{corev1.EventTypeNormal, locksv1alpha1.ReasonNoUnsafeSetting, cond.Message + " any more"})
		}
	} else {
		msgs := make([]string, len(findings))
		for i, f := range findings {
			msgs[i] = f.String()
			if old == nil || old.Status != metav1.ConditionFalse || !strings.Contains(old.Message, msgs[i]) {
				notes = append(notes, settingEvent{corev1.EventTypeWarning, locksv1alpha1.ReasonUnsafeSetting, msgs[i]})
			}
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, locksv1alpha1.ReasonUnsafeSetting, strings.Join(msgs, " ")
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return notes
}

// SetupWithManager registers the reconciler: it runs when a backend or a
// lock naming it changes, and when the backend's health, or what the check
// of its servers' settings found, changes.
func (r *BackendStatusReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("lockwarden")
	}
	r.notify = make(chan event.GenericEvent, notifyBuffer)
	r.Registry.OnHealth(func(id string, _ error) {
		if nn, ok := r.fromID(id); ok {
			obj := r.newObj()
			obj.SetNamespace(nn.Namespace)
			obj.SetName(nn.Name)
			select {
			case r.notify <- event.GenericEvent{Object: obj}:
			default: // the resync catches up
			}
		}
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(r.newObj()).
		Watches(&locksv1alpha1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			dl, ok := o.(*locksv1alpha1.DistributedLock)
			if !ok {
				return nil
			}
			if nn, ok := r.backendOfLock(dl); ok {
				return []reconcile.Request{{NamespacedName: nn}}
			}
			return nil
		})).
		WatchesRawSource(source.Channel(r.notify, &handler.EnqueueRequestForObject{})).
		Named(r.kind).
		Complete(r)
}
