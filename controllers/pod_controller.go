package controllers

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

const podKind = "Pod"

// podWaitRequeue is about how often a gated Pod tries its lock again. A
// lease that ends without a release (its holder's operator stopped, in this
// cluster or another) announces nothing: the waiting Pod finds it free at
// its next attempt, so this bounds how long after the TTL a standby starts.
const podWaitRequeue = time.Second

// podRetry is when a waiting Pod tries again. Only the head of the queue
// (or a Pod not queued) can take a lease that expires without a release, so
// only it tries every podWaitRequeue; the others keep their place at the
// pace of waiting Jobs, and a release wakes them all at once.
func podRetry(busy *lock.HeldError) time.Duration {
	if busy.Position <= 0 {
		return wait.Jitter(podWaitRequeue, 0.25)
	}
	return wait.Jitter(waitingRequeue, 0.1)
}

// PodReconciler runs the gated Pods of Deployments, StatefulSets, ReplicaSets
// and bare Pods: it acquires the lock for a Pod (holder mode Pod) or for its
// workload (holder mode Workload), writes the fencing token on the Pod and
// removes its scheduling gate, renews the lease while the Pod runs, and
// releases it when the Pod is done with (or, in Workload mode, when the
// workload has no live Pod left in this cluster).
type PodReconciler struct {
	Deps

	// lockChanged, when set, is told when a Pod acquires or releases, so
	// that the lock's status shows it at once.
	lockChanged func(types.NamespacedName)
	// workers is how many Pods are reconciled at once.
	workers int
	// budget bounds, per namespace, the reconciles of Pods that hold no lease.
	budget *namespaceBudget
	// rollouts remembers the rollouts found blocked, for the lock's status.
	rollouts *rolloutMemory
	// apiReader reads Deployments when a rollout may be blocked (not cached).
	apiReader client.Reader

	notify chan event.GenericEvent
	// acquiring serializes, per workload, the Pods that find it holding
	// nothing: two of its Pods reconciled at once must not both acquire
	// (the second would get a new fencing token and leave the first
	// with a stale one).
	acquiring [acquireStripes]sync.Mutex
	mu        sync.Mutex
	// lost are the leases the watchdog lost, by holder (a Pod, or a
	// workload for all its Pods), until a new acquisition for it.
	lost map[holder.Ref]watchdog.Lost
}

// NewPodReconciler returns the reconciler of gated Pods.
func NewPodReconciler(d Deps, lockChanged func(types.NamespacedName), rollouts *rolloutMemory) *PodReconciler {
	return &PodReconciler{
		Deps: d.withDefaults(), lockChanged: lockChanged, rollouts: rollouts, workers: 4,
		notify: make(chan event.GenericEvent, notifyBuffer), lost: map[holder.Ref]watchdog.Lost{},
	}
}

// The Pod controller patches gated Pods (fencing token, scheduling gate,
// finalizer, queue position), sets their LockHeld condition, evicts a Pod
// whose lease was lost under onLost Terminate, deletes a Pod that runs
// without its lock, and reads Deployments to tell a blocked rollout.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get

// SetupWithManager registers the reconciler.
func (r *PodReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.apiReader == nil {
		r.apiReader = mgr.GetAPIReader()
	}
	r.Registry.OnRelease(r.onRelease)
	r.Registry.OnHealth(r.onHealth)
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Pod{}).
		WatchesRawSource(source.Channel(r.notify, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.workers}).
		Named("pod").
		Complete(r)
}

// gatedPod is a Pod with what its reconcile needs to know about its lock.
type gatedPod struct {
	pod *corev1.Pod
	// dl is the Pod's lock; nil when it was deleted.
	dl   *locksv1alpha1.DistributedLock
	mode locksv1alpha1.HolderMode
	// ref is who holds the lease: the Pod, or its workload.
	ref    holder.Ref
	holder holder.Holder
	owner  string
	// keys are the store-side keys the holder acquires (the lock's, or the
	// one derived at the Pod's admission); keysErr says why it has none.
	keys    []string
	keysErr error
	leaves  []func()
}

func (g *gatedPod) leaveBackend() {
	for _, leave := range g.leaves {
		leave()
	}
	g.leaves = nil
}

// Reconcile moves one gated Pod through waiting, running and releasing.
func (r *PodReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pod corev1.Pod
	if err := r.Client.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone (its finalizer removed by someone else, or it was never
			// gated): a lease still renewed for it has no holder. A
			// workload's lease is checked by the sweep.
			ref := holder.Ref{Kind: podKind, Namespace: req.Namespace, Name: req.Name}
			releaseOrphan(ctx, r.Deps, ref, nil, "the Pod is gone")
			r.Registry.Forget(ref)
			r.clearLost(ref)
			r.budget.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if lease, _, held := r.Watchdog.Holding(podRef(&pod)); held {
		if why := podOrphaned(&pod, lease); why != "" {
			releaseOrphan(ctx, r.Deps, podRef(&pod), &pod, why)
		}
	}
	if pod.Labels[locksv1alpha1.LabelLock] == "" || !controllerutil.ContainsFinalizer(&pod, locksv1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	g, err := r.gatedPod(ctx, &pod)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer g.leaveBackend()
	switch {
	case podDone(&pod):
		return r.release(ctx, g)
	case podGated(&pod):
		if _, _, held := r.Watchdog.Holding(g.ref); !held {
			if res, ok := withinBudget(ctx, r.budget, podKind, req.NamespacedName, r.Clock.Now()); !ok {
				return res, nil
			}
		}
		return r.reconcileWaiting(ctx, g)
	default:
		return r.reconcileRunning(ctx, g)
	}
}

// gatedPod reads the Pod's lock and names its holder: the Pod, or in
// Workload mode the workload the Pod webhook recorded on it.
func (r *PodReconciler) gatedPod(ctx context.Context, pod *corev1.Pod) (*gatedPod, error) {
	lockName := pod.Labels[locksv1alpha1.LabelLock]
	g := &gatedPod{pod: pod, mode: locksv1alpha1.HolderModePod, ref: podRef(pod)}
	kind, name, uid := podKind, pod.Name, string(pod.UID)
	if locksv1alpha1.HolderMode(pod.Annotations[locksv1alpha1.AnnotationHolderMode]) == locksv1alpha1.HolderModeWorkload {
		if k, n, u, ok := parseWorkload(pod.Annotations[locksv1alpha1.AnnotationWorkload]); ok {
			kind, name, uid = k, n, u
			g.mode = locksv1alpha1.HolderModeWorkload
			g.ref = holder.Ref{Kind: k, Namespace: pod.Namespace, Name: n}
		}
	}
	g.holder = holder.Holder{
		Cluster: r.ClusterName, Namespace: pod.Namespace, Lock: lockName, Kind: kind, Name: name, UID: uid,
		Identity: holder.WorkloadIdentity(r.ClusterName, pod.Namespace, kind, name, uid),
	}
	g.owner = r.Tokens.Owner(g.holder)
	var dl locksv1alpha1.DistributedLock
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: lockName}, &dl); err == nil {
		g.dl = &dl
		g.keys, g.keysErr = backend.WorkloadKeys(g.dl, pod.Annotations)
	} else if client.IgnoreNotFound(err) != nil {
		return nil, err
	}
	return g, nil
}

func podRef(pod *corev1.Pod) holder.Ref {
	return holder.Ref{Kind: podKind, Namespace: pod.Namespace, Name: pod.Name}
}

// parseWorkload splits the workload annotation, Kind/name/uid.
func parseWorkload(s string) (kind, name, uid string, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}
	switch parts[0] {
	case "Deployment", "StatefulSet", "ReplicaSet":
		return parts[0], parts[1], parts[2], true
	}
	return "", "", "", false
}

// podGated tells whether the Pod still carries lockwarden's scheduling gate.
func podGated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(s corev1.PodSchedulingGate) bool { return s.Name == locksv1alpha1.SchedulingGate })
}

// podFinished tells whether the Pod's containers are done for good.
func podFinished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// podDone tells whether the Pod is done with its lock: finished, or being
// deleted.
func podDone(pod *corev1.Pod) bool {
	return podFinished(pod) || !pod.DeletionTimestamp.IsZero()
}

// podStopped tells whether a Pod being deleted no longer runs anything that
// may act on its lock: it never started (still gated, or never scheduled),
// it finished, all its containers terminated, it was force-deleted (grace
// period 0: whoever did so says it stopped), or it hands its lock over as
// soon as it terminates (lockwarden.io/handover: Terminating).
func podStopped(pod *corev1.Pod) bool {
	switch {
	case podGated(pod), pod.Spec.NodeName == "", podFinished(pod),
		pod.DeletionGracePeriodSeconds != nil && *pod.DeletionGracePeriodSeconds == 0,
		pod.Annotations[locksv1alpha1.AnnotationHandover] == locksv1alpha1.HandoverTerminating:
		return true
	}
	statuses := append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...)
	if len(statuses) == 0 {
		return false
	}
	for _, s := range statuses {
		if s.State.Terminated == nil && (s.State.Running != nil || s.State.Waiting == nil) {
			return false
		}
	}
	return true
}

// reconcileWaiting acquires the lock for a gated Pod (or finds its
// workload holding it) and starts it.
func (r *PodReconciler) reconcileWaiting(ctx context.Context, g *gatedPod) (ctrl.Result, error) {
	pod := g.pod
	if g.dl == nil {
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventLockNotFound, "Wait",
			"DistributedLock %q does not exist in namespace %q; the Pod stays gated until it does", pod.Labels[locksv1alpha1.LabelLock], pod.Namespace)
		return ctrl.Result{RequeueAfter: lockMissingRequeue}, nil
	}
	if lease, held := r.holding(g); held {
		// The workload holds already (another of its Pods acquired), or
		// the start patch of this Pod failed: start it with the lease held.
		return r.ungate(ctx, g, lease)
	}
	if g.mode == locksv1alpha1.HolderModeWorkload {
		mu := &r.acquiring[stripe(g.ref.String())]
		mu.Lock()
		defer mu.Unlock()
		if lease, held := r.holding(g); held {
			return r.ungate(ctx, g, lease) // another of its Pods acquired meanwhile
		}
		fence, err := r.workloadFence(ctx, pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		if fence > 0 {
			lease, res, err := r.recoverLease(ctx, g, fence)
			switch {
			case err == nil && lease == nil:
				return res, nil
			case err == nil:
				return r.ungate(ctx, g, lease)
			case !errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, lock.ErrPreempted):
				logf.FromContext(ctx).Error(err, "Taking over the lease of the workload failed; retrying", "lock", g.dl.Name)
				return ctrl.Result{RequeueAfter: backendRetry}, nil
			}
			// Lost: the running Pods learn it at their reconcile; this one
			// waits for a new lease.
		}
	}
	if g.keysErr != nil {
		r.eventf(g.pod, corev1.EventTypeWarning, locksv1alpha1.EventNoKey, "Acquire", "The Pod cannot take lock %s: %v", g.dl.Name, g.keysErr)
		return ctrl.Result{}, nil
	}
	h, res, ok := r.backendFor(ctx, g, "Acquire")
	if !ok {
		return res, nil
	}
	lease, err := h.Locker.TryAcquire(ctx, lock.Request{Keys: g.keys, TTL: lockTTL(g.dl), Owner: g.owner, Holder: g.holder.Encode(),
		Queue: true, Limit: int(g.dl.Spec.MaxHolders), Boost: backend.Boost(g.dl, backend.WorkloadPriority(pod.Annotations, pod.Spec.Priority)),
		Weight: backend.WorkloadWeight(pod.Annotations)})
	var busy *lock.HeldError
	var invalid *lock.InvalidRequestError
	switch {
	case err == nil:
		r.Watchdog.Hold(g.ref, h.Locker, lease)
		r.clearLost(g.ref)
		metrics.Acquisitions.WithLabelValues(podKind, metrics.ResultAcquired).Inc()
		logf.FromContext(ctx).Info("Acquired lock for Pod", "lock", g.dl.Name, "fence", lease.Fence, "holder", g.ref)
		r.Recorder.Eventf(g.dl, pod, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Acquired by %s %s with fencing token %d", g.ref.Kind, g.ref.Name, lease.Fence)
		if g.mode == locksv1alpha1.HolderModeWorkload {
			r.enqueueWorkload(ctx, g.ref, pod.Labels[locksv1alpha1.LabelLock])
		}
		// A rollout found blocked on this lock moves again.
		r.rollouts.clear(types.NamespacedName{Namespace: pod.Namespace, Name: g.dl.Name})
		return r.ungate(ctx, g, lease)
	case errors.As(err, &busy):
		metrics.Acquisitions.WithLabelValues(podKind, metrics.ResultBusy).Inc()
		if err := r.showWait(ctx, g, busy); err != nil {
			return ctrl.Result{}, err
		}
		r.checkRollout(ctx, g, busy)
		return ctrl.Result{RequeueAfter: podRetry(busy)}, nil
	case errors.Is(err, lock.ErrReplaced):
		// Contention applies to Jobs; a waiting Pod that a newer Job with
		// ReplaceQueued or CancelInProgress dropped from the queue joins
		// it again at the back once the replacement lapses.
		metrics.Acquisitions.WithLabelValues(podKind, metrics.ResultBusy).Inc()
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventReplaced, "Acquire",
			"Lock %s: a newer Job with contention ReplaceQueued or CancelInProgress replaced the Pod in the queue; it joins the queue again at the back within a minute", g.dl.Name)
		return ctrl.Result{RequeueAfter: lockMissingRequeue}, nil
	case errors.As(err, &invalid):
		metrics.Acquisitions.WithLabelValues(podKind, metrics.ResultError).Inc()
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.ReasonInvalidBackend, "Acquire",
			"Lock %s cannot be acquired: %s; the Pod stays gated until the lock or its backend changes", g.dl.Name, invalid.Error())
		return ctrl.Result{RequeueAfter: lockMissingRequeue}, nil
	default:
		metrics.Acquisitions.WithLabelValues(podKind, metrics.ResultError).Inc()
		logf.FromContext(ctx).Error(err, "Acquiring lock failed", "lock", g.dl.Name)
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventBackendUnavailable, "Acquire", "Lock %s: %s", g.dl.Name, backend.Describe(err))
		return ctrl.Result{RequeueAfter: backendRetry}, nil
	}
}

// showWait writes the Pod's place in the queue when it changed.
func (r *PodReconciler) showWait(ctx context.Context, g *gatedPod, busy *lock.HeldError) error {
	pod := g.pod
	position, waitingFor := describeWait(busy)
	if pod.Annotations[locksv1alpha1.AnnotationQueuePosition] == position && pod.Annotations[locksv1alpha1.AnnotationWaitingFor] == waitingFor {
		return nil
	}
	before := pod.DeepCopy()
	setOrDelete(&pod.ObjectMeta, locksv1alpha1.AnnotationQueuePosition, position)
	setOrDelete(&pod.ObjectMeta, locksv1alpha1.AnnotationWaitingFor, waitingFor)
	if err := r.Client.Patch(ctx, pod, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("show the Pod's place in the queue: %w", err)
	}
	if before.Annotations[locksv1alpha1.AnnotationQueuePosition] == "" {
		r.eventf(pod, corev1.EventTypeNormal, locksv1alpha1.EventWaiting, "Wait", "Waiting for lock %s: %s", g.dl.Name, busy.Error())
	}
	return nil
}

// ungate records the fencing token and holder on the Pod and removes its
// scheduling gate, in one patch that carries the Pod's resourceVersion: the
// Pod's containers read the token from the annotations when they start,
// which is only after the gate is gone.
func (r *PodReconciler) ungate(ctx context.Context, g *gatedPod, lease *lock.Lease) (ctrl.Result, error) {
	pod := g.pod
	before := pod.DeepCopy()
	setAnnotation(&pod.ObjectMeta, locksv1alpha1.AnnotationFencingToken, strconv.FormatInt(lease.Fence, 10))
	setAnnotation(&pod.ObjectMeta, locksv1alpha1.AnnotationHolder, g.holder.Identity)
	delete(pod.Annotations, locksv1alpha1.AnnotationQueuePosition)
	delete(pod.Annotations, locksv1alpha1.AnnotationWaitingFor)
	pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(s corev1.PodSchedulingGate) bool { return s.Name == locksv1alpha1.SchedulingGate })
	if err := r.Client.Patch(ctx, pod, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		// Still held and renewed: the next reconcile starts it with the same lease.
		return ctrl.Result{}, fmt.Errorf("start Pod with fencing token %d: %w", lease.Fence, err)
	}
	r.eventf(pod, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Lock %s held by %s with fencing token %d; the Pod may be scheduled", g.dl.Name, g.holder.Identity, lease.Fence)
	r.notifyLock(pod)
	return ctrl.Result{}, nil
}

// reconcileRunning keeps the lease of a started Pod renewed; after a restart
// of the operator it takes the lease over with the same owner token and
// fence. A lost lease is reported on the Pod, and the lock's onLost applied.
func (r *PodReconciler) reconcileRunning(ctx context.Context, g *gatedPod) (ctrl.Result, error) {
	pod := g.pod
	if pod.Annotations[locksv1alpha1.AnnotationLost] != "" {
		// Reported; it runs on (Ignore), or is evicted (Terminate): an
		// eviction refused (a PodDisruptionBudget) is tried again.
		if g.dl != nil && g.dl.Spec.OnLost == locksv1alpha1.OnLostTerminate {
			return r.evict(ctx, g)
		}
		return ctrl.Result{}, nil
	}
	fence, _ := strconv.ParseInt(pod.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	if fence == 0 {
		// Ungated by someone else (the shipped admission policy refuses
		// that): it may run without the lock. A gate cannot be put back.
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventUnsuspendedWithoutLock, "Delete",
			"The Pod's scheduling gate %s was removed before it held lock %s; deleting the Pod so that its workload creates a gated one", locksv1alpha1.SchedulingGate, pod.Labels[locksv1alpha1.LabelLock])
		if err := r.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("delete Pod started without its lock: %w", err)
		}
		return ctrl.Result{}, nil
	}
	if l, ok := r.lostOf(g.ref); ok && (l.Lease == nil || l.Lease.Fence == fence) {
		return r.handleLost(ctx, g, lostCause(l))
	}
	if lease, ok := r.holding(g); ok {
		if lease.Fence != fence {
			// The workload acquired again after this Pod's lease was lost
			// without this Pod being told (an operator restart between):
			// this Pod's token is stale.
			return r.handleLost(ctx, g, fmt.Errorf("%w: the workload holds the lock with fencing token %d now", lock.ErrLost, lease.Fence))
		}
		return ctrl.Result{}, nil
	}
	if g.dl == nil {
		metrics.LeasesLost.WithLabelValues(podKind).Inc()
		return r.handleLost(ctx, g, fmt.Errorf("%w: DistributedLock %q was deleted", lock.ErrLost, pod.Labels[locksv1alpha1.LabelLock]))
	}
	_, res, err := r.recoverLease(ctx, g, fence)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, lock.ErrLost), errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrPreempted):
		// (Only Jobs are preempted, by CancelInProgress: a Pod's lease that
		// a store says is preempted is as good as lost.)
		metrics.LeasesLost.WithLabelValues(podKind).Inc()
		return r.handleLost(ctx, g, err)
	default:
		logf.FromContext(ctx).Error(err, "Taking over the lease of a running Pod failed; retrying", "lock", g.dl.Name)
		return ctrl.Result{RequeueAfter: backendRetry}, nil
	}
}

// recoverLease takes over, after a restart of the operator, the lease a
// running Pod (or its workload) holds with fence: the same owner token
// renews it, and the watchdog renews it from then on. A nil lease with a nil
// error means the backend cannot be asked now; res says when to try again.
func (r *PodReconciler) recoverLease(ctx context.Context, g *gatedPod, fence int64) (*lock.Lease, ctrl.Result, error) {
	h, res, ok := r.backendFor(ctx, g, "Renew")
	if !ok {
		return nil, res, nil
	}
	renewed, err := takeOverLease(ctx, r.Deps, h, g.ref, g.dl, g.keys, g.holder, g.owner, fence)
	return renewed, ctrl.Result{}, err
}

// holding returns the lease the watchdog renews for g's holder, if it is
// this holder's: a workload deleted and created again under the same name
// (its old Pods still terminating) has another UID, and never starts its
// Pods with the old one's lease.
func (r *PodReconciler) holding(g *gatedPod) (*lock.Lease, bool) {
	lease, _, ok := r.Watchdog.Holding(g.ref)
	if !ok || holder.Decode(lease.Holder).UID != g.holder.UID {
		return nil, false
	}
	return lease, true
}

// acquireStripes is how many locks serialize the acquisitions of workloads.
const acquireStripes = 64

// stripe maps s to one of acquireStripes.
func stripe(s string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return int(h.Sum32() % acquireStripes)
}

// workloadFence returns the fencing token the running Pods of pod's
// workload hold (0 when none runs with one): after a restart of the
// operator a new Pod of a holding workload must join that lease, never
// acquire another (which would give the running Pods a stale token).
func (r *PodReconciler) workloadFence(ctx context.Context, pod *corev1.Pod) (int64, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(pod.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: pod.Labels[locksv1alpha1.LabelLock]}); err != nil {
		return 0, fmt.Errorf("list the Pods of the workload: %w", err)
	}
	var fence int64
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations[locksv1alpha1.AnnotationWorkload] != pod.Annotations[locksv1alpha1.AnnotationWorkload] || podGated(p) || p.Annotations[locksv1alpha1.AnnotationLost] != "" || !holdsForWorkload(p) {
			continue
		}
		if f, err := strconv.ParseInt(p.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64); err == nil && f > fence {
			fence = f
		}
	}
	return fence, nil
}

// handleLost records a running Pod's lost lease on the Pod (annotation,
// condition LockHeld=False, Event) and, when the lock's onLost is
// Terminate, evicts it: its workload creates a gated Pod in its place.
func (r *PodReconciler) handleLost(ctx context.Context, g *gatedPod, cause error) (ctrl.Result, error) {
	pod := g.pod
	if g.mode == locksv1alpha1.HolderModePod {
		r.Watchdog.Drop(g.ref)
		r.clearLost(g.ref)
	}
	fence := pod.Annotations[locksv1alpha1.AnnotationFencingToken]
	now := metav1.NewTime(r.Clock.Now())
	before := pod.DeepCopy()
	setAnnotation(&pod.ObjectMeta, locksv1alpha1.AnnotationLost, fmt.Sprintf("%s: %s", now.UTC().Format(time.RFC3339), backend.Describe(cause)))
	if err := r.Client.Patch(ctx, pod, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("record lost lease: %w", err)
	}
	beforeStatus := pod.DeepCopy()
	cond := corev1.PodCondition{Type: locksv1alpha1.PodConditionLockHeld, Status: corev1.ConditionFalse, Reason: locksv1alpha1.ReasonLost,
		Message: fmt.Sprintf("The lease of lock %s (fencing token %s) was lost: %s", pod.Labels[locksv1alpha1.LabelLock], fence, backend.Describe(cause)), LastTransitionTime: now}
	pod.Status.Conditions = append(slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == cond.Type }), cond)
	if err := r.Client.Status().Patch(ctx, pod, client.MergeFrom(beforeStatus)); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "Setting the Pod's LockHeld condition failed; the annotation and Event say it")
	}
	r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventLost, "Renew", "Lost the lease of lock %s (fencing token %s): %s", pod.Labels[locksv1alpha1.LabelLock], fence, backend.Describe(cause))
	logf.FromContext(ctx).Info("Pod lost its lease", "fence", fence, "holder", g.ref, "cause", cause.Error())
	if g.dl != nil && g.dl.Spec.OnLost == locksv1alpha1.OnLostTerminate {
		return r.evict(ctx, g)
	}
	return ctrl.Result{}, nil
}

// evict evicts a Pod whose lease was lost under onLost Terminate, through
// the Eviction API (PodDisruptionBudgets apply); a refused eviction is tried
// again until the Pod is gone.
func (r *PodReconciler) evict(ctx context.Context, g *gatedPod) (ctrl.Result, error) {
	pod := g.pod
	if !pod.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}
	if err := r.Client.SubResource("eviction").Create(ctx, pod, ev); client.IgnoreNotFound(err) != nil {
		r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventTerminated, "Terminate",
			"Evicting the Pod after its lease was lost failed: %s; it runs on with a stale fencing token, trying again", backend.Describe(err))
		return ctrl.Result{RequeueAfter: backendRetry}, nil
	}
	r.eventf(pod, corev1.EventTypeWarning, locksv1alpha1.EventTerminated, "Terminate", "Evicted the Pod: its lease was lost and the lock's onLost is Terminate")
	return ctrl.Result{}, nil
}

// release gives up what a Pod that is done with its lock holds: its lease
// (Pod mode; in Workload mode the workload's, once it has no other live
// Pod here) and its place in the queue, then removes the finalizer. A Pod
// being deleted releases only once it stopped (podStopped): until then its
// containers may still act on the lock.
func (r *PodReconciler) release(ctx context.Context, g *gatedPod) (ctrl.Result, error) {
	pod := g.pod
	if !podStopped(pod) {
		return ctrl.Result{}, nil // its status changes when it stops, which reconciles it again
	}
	releaseLease := true
	if g.mode == locksv1alpha1.HolderModeWorkload {
		others, err := r.liveWorkloadPods(ctx, pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		releaseLease = others == 0
	}
	if releaseLease {
		if err := r.releaseLease(ctx, g); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := pod.DeepCopy()
	changed := controllerutil.RemoveFinalizer(pod, locksv1alpha1.Finalizer)
	for _, k := range []string{locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor} {
		if _, ok := pod.Annotations[k]; ok {
			delete(pod.Annotations, k)
			changed = true
		}
	}
	if changed {
		if err := r.Client.Patch(ctx, pod, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
		}
	}
	if g.mode == locksv1alpha1.HolderModePod {
		r.Registry.Forget(g.ref)
		r.budget.forget(client.ObjectKeyFromObject(pod))
	}
	return ctrl.Result{}, nil
}

// releaseLease releases the lease held for g's holder and leaves the queue.
func (r *PodReconciler) releaseLease(ctx context.Context, g *gatedPod) error {
	pod := g.pod
	lease, locker, held := r.Watchdog.Holding(g.ref)
	if held && holder.Decode(lease.Holder).UID != g.holder.UID {
		// Another workload of the same name holds (this one was deleted
		// and created again): not this Pod's to release.
		lease, locker, held = nil, nil, false
	}
	if !held && g.dl != nil && len(g.keys) > 0 {
		h, err := r.Registry.For(ctx, g.ref, g.dl)
		if err != nil {
			return nil // nothing to release it with; it expires with its TTL
		}
		locker = h.Locker
		fence, _ := strconv.ParseInt(pod.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
		lease = &lock.Lease{Keys: g.keys, Owner: g.owner, Holder: g.holder.Encode(), Fence: fence, Limit: int(g.dl.Spec.MaxHolders)}
		if fence == 0 || pod.Annotations[locksv1alpha1.AnnotationLost] != "" {
			lease = nil // it never held, or lost what it held: only leave the queue
		}
	}
	if locker == nil {
		return nil
	}
	r.Watchdog.Drop(g.ref)
	if lease != nil {
		until, err := releaseOrCool(ctx, locker, lease, cooldownOf(g.dl), r.Clock.Now())
		switch {
		case err == nil:
			if !lease.Acquired.IsZero() {
				metrics.HoldSeconds.WithLabelValues(podKind).Observe(r.Clock.Since(lease.Acquired).Seconds())
			}
			r.eventf(pod, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released lock %s (fencing token %d)%s", pod.Labels[locksv1alpha1.LabelLock], lease.Fence, cooldownNote(until))
			if g.dl != nil {
				r.Recorder.Eventf(g.dl, pod, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released by %s %s (fencing token %d)%s", g.ref.Kind, g.ref.Name, lease.Fence, cooldownNote(until))
			}
			logf.FromContext(ctx).Info("Released lock of Pod", "fence", lease.Fence, "holder", g.ref)
		case errors.Is(err, lock.ErrNotHeld):
		default:
			if r.Clock.Now().Before(lease.Expires) {
				return fmt.Errorf("release lock of Pod (it expires with its TTL): %w", err)
			}
		}
	}
	// The lock may be gone (a namespace being deleted deletes it beside its
	// Pods): the lease held knows its keys.
	var keys []string
	switch {
	case len(g.keys) > 0:
		keys = g.keys
	case lease != nil:
		keys = lease.Keys
	}
	if keys != nil {
		if err := locker.Dequeue(ctx, keys, g.owner); err != nil {
			logf.FromContext(ctx).V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "error", err.Error())
		}
	}
	r.notifyLock(pod)
	return nil
}

// holdsForWorkload tells whether a Pod of a workload in Workload mode keeps
// the workload's lease: it is gated by lockwarden and not done with the
// lock, or being deleted but not stopped yet (its containers may still act
// on the lock).
func holdsForWorkload(p *corev1.Pod) bool {
	return controllerutil.ContainsFinalizer(p, locksv1alpha1.Finalizer) && (!podDone(p) || !podStopped(p))
}

// liveWorkloadPods counts the other Pods of pod's workload (same lock, same
// workload annotation) that keep the workload's lease (holdsForWorkload).
func (r *PodReconciler) liveWorkloadPods(ctx context.Context, pod *corev1.Pod) (int, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(pod.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: pod.Labels[locksv1alpha1.LabelLock]}); err != nil {
		return 0, fmt.Errorf("list the Pods of the workload: %w", err)
	}
	n := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID != pod.UID && p.Annotations[locksv1alpha1.AnnotationWorkload] == pod.Annotations[locksv1alpha1.AnnotationWorkload] && holdsForWorkload(p) {
			n++
		}
	}
	return n, nil
}

// backendFor returns the Pod's backend when the lock may use it and it
// answers (see holderBackend).
func (r *PodReconciler) backendFor(ctx context.Context, g *gatedPod, action string) (backend.Handle, ctrl.Result, bool) {
	return holderBackend(ctx, r.Deps, holderUse{ref: g.ref, dl: g.dl, obj: g.pod, leaves: &g.leaves, stays: "the Pod stays gated"}, action)
}

// onRelease wakes the waiting Pods of the locks on a released key.
func (r *PodReconciler) onRelease(backendID, key string) {
	r.wakeWaiting(indexBackendKey, backendKeyValues(backendID, key)[0])
}

// onHealth wakes the waiting Pods of every lock on a backend that started
// answering.
func (r *PodReconciler) onHealth(backendID string, err error) {
	if err == nil {
		r.wakeWaiting(indexBackend, backendID)
	}
}

// wakeWaiting enqueues the gated Pods of the locks the index maps value to.
func (r *PodReconciler) wakeWaiting(index, value string) {
	ctx := context.Background()
	var locks locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &locks, client.MatchingFields{index: value}); err != nil {
		return // the waiting Pods try again within podWaitRequeue
	}
	for i := range locks.Items {
		dl := &locks.Items[i]
		var pods corev1.PodList
		if err := r.Client.List(ctx, &pods, client.InNamespace(dl.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: dl.Name}); err != nil {
			continue
		}
		for j := range pods.Items {
			if podGated(&pods.Items[j]) {
				r.enqueue(client.ObjectKeyFromObject(&pods.Items[j]))
			}
		}
	}
}

// onLost is the watchdog's callback: it remembers a lost lease of a Pod or
// workload and asks for a reconcile of the Pods that held through it.
func (r *PodReconciler) onLost(l watchdog.Lost) {
	switch l.Ref.Kind {
	case podKind:
		r.recordLost(l)
		r.enqueue(types.NamespacedName{Namespace: l.Ref.Namespace, Name: l.Ref.Name})
	case "Deployment", "StatefulSet", "ReplicaSet":
		r.recordLost(l)
		r.enqueueWorkload(context.Background(), l.Ref, holder.Decode(l.Lease.Holder).Lock)
	}
}

// enqueueWorkload asks for a reconcile of every Pod of the workload ref on lock.
func (r *PodReconciler) enqueueWorkload(ctx context.Context, ref holder.Ref, lock string) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ref.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: lock}); err != nil {
		r.Log.Error(err, "Listing the Pods of a workload failed; they catch up at their next requeue", "workload", ref)
		return
	}
	for i := range pods.Items {
		if k, n, _, ok := parseWorkload(pods.Items[i].Annotations[locksv1alpha1.AnnotationWorkload]); ok && k == ref.Kind && n == ref.Name {
			r.enqueue(client.ObjectKeyFromObject(&pods.Items[i]))
		}
	}
}

func (r *PodReconciler) recordLost(l watchdog.Lost) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost[l.Ref] = l
}

func (r *PodReconciler) lostOf(ref holder.Ref) (watchdog.Lost, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.lost[ref]
	return l, ok
}

func (r *PodReconciler) clearLost(ref holder.Ref) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lost, ref)
}

// enqueue asks for a reconcile of one Pod.
func (r *PodReconciler) enqueue(nn types.NamespacedName) {
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = nn.Namespace, nn.Name
	select {
	case r.notify <- event.GenericEvent{Object: pod}:
	default:
	}
}

func (r *PodReconciler) notifyLock(pod *corev1.Pod) {
	if r.lockChanged != nil {
		r.lockChanged(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[locksv1alpha1.LabelLock]})
	}
}

func (r *PodReconciler) eventf(obj client.Object, eventtype, reason, action, note string, args ...any) {
	r.Recorder.Eventf(obj, nil, eventtype, reason, action, note, args...)
}

// podWorkloadOrphaned says why the lease held for a workload has no holder in
// this cluster any more ("" when it has one): no live gated Pod of the
// workload is left.
func podWorkloadOrphaned(ctx context.Context, c client.Reader, ref holder.Ref, lease *lock.Lease) (string, error) {
	h := holder.Decode(lease.Holder)
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ref.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: h.Lock}); err != nil {
		return "", err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations[locksv1alpha1.AnnotationWorkload] == ref.Kind+"/"+ref.Name+"/"+h.UID && holdsForWorkload(p) {
			return "", nil
		}
	}
	return fmt.Sprintf("the %s has no live Pod left that holds lock %s", ref.Kind, h.Lock), nil
}
