package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
)

// KueueControllerName is the controllerName of the Kueue AdmissionChecks
// lockwarden answers: a ClusterQueue that lists such a check admits a
// Workload whose Job names a lock only while lockwarden holds that lock for it.
const KueueControllerName = "lockwarden.io/lock"

// workloadKind is the Kind of the leases held for Kueue Workloads.
const workloadKind = "Workload"

// kueueFieldOwner is the field manager of lockwarden's admission check states.
const kueueFieldOwner = "lockwarden"

// WorkloadReconciler is lockwarden's Kueue admission check controller: for a
// Workload whose Job names a lock and whose ClusterQueue uses an
// AdmissionCheck of controllerName KueueControllerName, it acquires the lock
// once Kueue reserved quota, and sets the check Ready with the fencing token
// and holder as pod annotations (Kueue writes them into the Job's pod
// template when it starts the Job); it renews the lease while the Workload
// holds its quota, and releases it when the Workload finishes, gives its
// quota back (evicted, preempted, deactivated: Kueue does so once the Job's
// pods stopped) or is deleted. A lost lease sets the check to Retry: Kueue
// evicts the Workload, and it queues again.
//
// The lease is held for the Workload (holder Kind "Workload", its name and
// UID), with the owner token derived as for a Job.
type WorkloadReconciler struct {
	Deps
	*tracker

	// APIReader reads the Jobs that own Workloads, and their CronJobs:
	// the manager caches only the Jobs lockwarden gates itself.
	APIReader client.Reader
}

// The admission check controller reads Workloads and writes its check's
// state; it reads AdmissionChecks to know which are its own, and marks them
// Active. It reads the Workload's Job (already allowed: jobs get).
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads,verbs=get;list;watch
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads/status,verbs=get;patch;update
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=admissionchecks,verbs=get;list;watch
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=admissionchecks/status,verbs=get;patch

// NewWorkloadReconciler returns the Kueue admission check controller.
func NewWorkloadReconciler(d Deps, apiReader client.Reader) *WorkloadReconciler {
	return &WorkloadReconciler{
		Deps:      d.withDefaults(),
		tracker:   newTracker(workloadKind, func() client.Object { return &kueue.Workload{} }),
		APIReader: apiReader,
	}
}

// SetupWithManager registers the Workload and AdmissionCheck controllers.
func (r *WorkloadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Watchdog.OnLost(r.onLost)
	r.Registry.OnRelease(func(string, string) { r.wakeWaiting() })
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&kueue.Workload{}).
		WatchesRawSource(r.source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: DefaultWorkers}).
		Named("kueue-workload").
		Complete(r); err != nil {
		return err
	}
	return (&AdmissionCheckReconciler{Client: r.Client}).SetupWithManager(mgr)
}

// wakeWaiting asks for a reconcile of every Workload that waits for its
// lock: a release may be its turn. (Few Workloads wait at once: Kueue
// reserves quota for them first.)
func (r *WorkloadReconciler) wakeWaiting() {
	r.mu.Lock()
	waiting := slices.Collect(maps.Keys(r.waitingSince))
	r.mu.Unlock()
	for _, nn := range waiting {
		r.enqueue(nn)
	}
}

// workloadLock is a Workload with what its reconcile needs to know about its lock.
type workloadLock struct {
	wl *kueue.Workload
	// check is the name of lockwarden's admission check on the Workload.
	check kueue.AdmissionCheckReference
	// lockName is the lock its Job names ("" when none); dl is that lock,
	// nil when it does not exist.
	lockName string
	dl       *locksv1alpha1.DistributedLock
	// job is the Workload's Job (metadata only), nil when it has none.
	job    *metav1.PartialObjectMetadata
	ref    holder.Ref
	holder holder.Holder
	owner  string
	// keys are the store-side keys the Workload acquires (its lock's, or
	// the one derived at its Job's admission); keysErr says why it has none.
	keys    []string
	keysErr error
}

// Reconcile acquires, keeps or releases the lock of one Workload.
func (r *WorkloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ref := holder.Ref{Kind: workloadKind, Namespace: req.Namespace, Name: req.Name}
	var wl kueue.Workload
	if err := r.Client.Get(ctx, req.NamespacedName, &wl); err != nil {
		if apierrors.IsNotFound(err) {
			releaseOrphan(ctx, r.Deps, ref, nil, "the Workload is gone")
			r.Registry.Forget(ref)
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	check, err := r.ownCheck(ctx, &wl)
	if err != nil {
		return ctrl.Result{}, err
	}
	if check == "" {
		// Not ours (or no longer: its ClusterQueue dropped the check).
		releaseOrphan(ctx, r.Deps, ref, &wl, "the Workload no longer has lockwarden's admission check")
		return ctrl.Result{}, nil
	}
	g, err := r.workloadLock(ctx, &wl, check)
	if err != nil {
		return ctrl.Result{}, err
	}
	if g.lockName == "" {
		return r.setCheck(ctx, g, kueue.CheckStateReady, "The Workload's Job names no lock (annotation lockwarden.io/lock): nothing to hold", nil)
	}
	if l, ok := r.lostOf(req.NamespacedName); ok {
		res, err := r.reportLost(ctx, g, lostCause(l))
		if err == nil {
			r.clearLost(req.NamespacedName, l)
		}
		return res, err
	}
	switch {
	case !wl.DeletionTimestamp.IsZero() || workloadCondition(&wl, kueue.WorkloadFinished):
		if g.releasedAtFinish() {
			return ctrl.Result{}, nil // released already: no call to the store
		}
		return r.releaseWorkload(ctx, g, "")
	case !workloadCondition(&wl, kueue.WorkloadQuotaReserved):
		return r.releaseWorkload(ctx, g, "The Workload gave back its quota; lockwarden acquires the lock again when quota is reserved again")
	default:
		return r.admit(ctx, g)
	}
}

// ownCheck returns the name of the admission check on the Workload that
// lockwarden answers ("" when none): one whose AdmissionCheck has
// controllerName KueueControllerName.
func (r *WorkloadReconciler) ownCheck(ctx context.Context, wl *kueue.Workload) (kueue.AdmissionCheckReference, error) {
	for _, s := range wl.Status.AdmissionChecks {
		var ac kueue.AdmissionCheck
		if err := r.Client.Get(ctx, types.NamespacedName{Name: string(s.Name)}, &ac); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return "", fmt.Errorf("read AdmissionCheck %s: %w", s.Name, err)
		}
		if ac.Spec.ControllerName == KueueControllerName {
			return s.Name, nil
		}
	}
	return "", nil
}

// workloadLock finds the lock the Workload's Job names: the Job's
// lockwarden.io/lock annotation (the webhook copies its CronJob's there),
// else its CronJob's (the owner's UID checked).
func (r *WorkloadReconciler) workloadLock(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference) (*workloadLock, error) {
	g := &workloadLock{wl: wl, check: check, ref: holder.Ref{Kind: workloadKind, Namespace: wl.Namespace, Name: wl.Name}}
	if owner := controllerOf(wl.OwnerReferences, "Job"); owner != nil {
		job, err := r.metadataOf(ctx, "Job", wl.Namespace, owner)
		if err != nil {
			return nil, err
		}
		g.job = job
		if job != nil {
			g.lockName = job.Annotations[locksv1alpha1.AnnotationLock]
			if cjRef := controllerOf(job.OwnerReferences, "CronJob"); g.lockName == "" && cjRef != nil {
				cj, err := r.metadataOf(ctx, "CronJob", wl.Namespace, cjRef)
				if err != nil {
					return nil, err
				}
				if cj != nil {
					g.lockName = cj.Annotations[locksv1alpha1.AnnotationLock]
				}
			}
		}
	}
	g.holder = holder.Holder{
		Cluster: r.ClusterName, Namespace: wl.Namespace, Lock: g.lockName, Kind: workloadKind, Name: wl.Name, UID: string(wl.UID),
		Identity: holder.WorkloadIdentity(r.ClusterName, wl.Namespace, workloadKind, wl.Name, string(wl.UID)),
	}
	g.owner = r.Tokens.Owner(g.holder)
	if g.lockName == "" {
		return g, nil
	}
	var dl locksv1alpha1.DistributedLock
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: wl.Namespace, Name: g.lockName}, &dl); err == nil {
		g.dl = &dl
		var annotations map[string]string
		if g.job != nil {
			annotations = g.job.Annotations
		}
		g.keys, g.keysErr = backend.WorkloadKeys(g.dl, annotations)
	} else if client.IgnoreNotFound(err) != nil {
		return nil, err
	}
	return g, nil
}

// controllerOf returns the controlling owner reference of the batch Kind, if any.
func controllerOf(refs []metav1.OwnerReference, kind string) *metav1.OwnerReference {
	for i := range refs {
		r := &refs[i]
		if r.Kind == kind && r.Controller != nil && *r.Controller && schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).Group == batchv1.GroupName {
			return r
		}
	}
	return nil
}

// metadataOf reads the metadata of the owner ref (a Job or CronJob) from
// the API server; nil when it is gone or is another object of the same name.
func (r *WorkloadReconciler) metadataOf(ctx context.Context, kind, namespace string, ref *metav1.OwnerReference) (*metav1.PartialObjectMetadata, error) {
	var m metav1.PartialObjectMetadata
	m.SetGroupVersionKind(batchv1.SchemeGroupVersion.WithKind(kind))
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, &m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s %s/%s of the Workload: %w", kind, namespace, ref.Name, err)
	}
	if m.UID != ref.UID {
		return nil, nil
	}
	return &m, nil
}

func workloadCondition(wl *kueue.Workload, t string) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, t)
}

// checkState returns lockwarden's admission check state on the Workload.
func (g *workloadLock) checkState() *kueue.AdmissionCheckState {
	for i := range g.wl.Status.AdmissionChecks {
		if g.wl.Status.AdmissionChecks[i].Name == g.check {
			return &g.wl.Status.AdmissionChecks[i]
		}
	}
	return nil
}

// admit holds the lock for a Workload with reserved quota: it acquires it
// (or keeps waiting in the queue), or takes over the lease of a Workload
// admitted before a restart, and shows the check Ready with the token.
func (r *WorkloadReconciler) admit(ctx context.Context, g *workloadLock) (ctrl.Result, error) {
	nn := client.ObjectKeyFromObject(g.wl)
	state := g.checkState()
	if lease, _, held := r.Watchdog.Holding(g.ref); held {
		return r.setReady(ctx, g, lease)
	}
	if state != nil && (state.State == kueue.CheckStateRetry || state.State == kueue.CheckStateRejected) {
		return ctrl.Result{}, nil // Kueue evicts it and sets the check back to Pending
	}
	if g.dl == nil {
		r.Recorder.Eventf(g.wl, nil, corev1.EventTypeWarning, locksv1alpha1.EventLockNotFound, "Wait",
			"DistributedLock %q does not exist in namespace %q; the Workload is not admitted until it does", g.lockName, g.wl.Namespace)
		return r.setPending(ctx, g,
			fmt.Sprintf("DistributedLock %q does not exist in namespace %q", g.lockName, g.wl.Namespace), lockMissingRequeue)
	}
	if g.keysErr != nil {
		return r.setPending(ctx, g, fmt.Sprintf("Lock %s cannot be taken: the Job %v", g.dl.Name, g.keysErr), lockMissingRequeue)
	}
	h, err := r.Registry.For(ctx, g.ref, g.dl)
	if err == nil {
		err = h.Health()
	}
	if err != nil {
		var pe *backend.PolicyError
		msg := fmt.Sprintf("Lock %s: %s", g.dl.Name, backend.Describe(err))
		if errors.As(err, &pe) {
			msg = fmt.Sprintf("Lock %s cannot be acquired: %s", g.dl.Name, pe.Error())
		}
		retry := backendRetry
		if errors.Is(err, backend.ErrConnecting) {
			retry = connectingRequeue
		}
		return r.setPending(ctx, g, msg, retry)
	}
	if fence, ok := g.readyFence(); ok {
		// Ready before a restart of the operator: the Job may run with this
		// token. Take the lease over; never acquire a new one for it.
		return r.takeOver(ctx, g, h, fence)
	}
	lease, err := h.Locker.TryAcquire(ctx, lock.Request{Keys: g.keys, TTL: lockTTL(g.dl), Owner: g.owner, Holder: g.holder.Encode(),
		Queue: true, Limit: int(g.dl.Spec.MaxHolders), Boost: backend.Boost(g.dl, backend.WorkloadPriority(g.wl.Annotations, g.wl.Spec.Priority)),
		Weight: backend.WorkloadWeight(g.wl.Annotations)})
	var busy *lock.HeldError
	switch {
	case err == nil:
		r.Watchdog.Hold(g.ref, h.Locker, lease)
		metrics.Acquisitions.WithLabelValues(workloadKind, metrics.ResultAcquired).Inc()
		r.stopWaiting(nn, lease.Acquired)
		logf.FromContext(ctx).Info("Acquired lock for Workload", "lock", g.dl.Name, "fence", lease.Fence)
		r.Recorder.Eventf(g.wl, nil, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Acquired lock %s with fencing token %d", g.dl.Name, lease.Fence)
		r.Recorder.Eventf(g.dl, g.wl, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Acquired by Workload %s with fencing token %d", g.wl.Name, lease.Fence)
		return r.setReady(ctx, g, lease)
	case errors.As(err, &busy):
		metrics.Acquisitions.WithLabelValues(workloadKind, metrics.ResultBusy).Inc()
		r.startWaiting(nn, r.Clock.Now())
		position, waitingFor := describeWait(busy)
		msg := fmt.Sprintf("Waiting for lock %s: %s", g.dl.Name, waitingFor)
		if position != "" {
			msg += fmt.Sprintf(" (queue position %s)", position)
		}
		return r.setPending(ctx, g, msg, waitingRequeue)
	case errors.Is(err, lock.ErrReplaced):
		metrics.Acquisitions.WithLabelValues(workloadKind, metrics.ResultBusy).Inc()
		return r.setPending(ctx, g, fmt.Sprintf("Waiting for lock %s: a newer Job with contention ReplaceQueued or CancelInProgress replaced this Workload in the queue; it joins the queue again at the back within a minute", g.dl.Name), lockMissingRequeue)
	default:
		metrics.Acquisitions.WithLabelValues(workloadKind, metrics.ResultError).Inc()
		logf.FromContext(ctx).Error(err, "Acquiring lock for Workload failed", "lock", g.dl.Name)
		return r.setPending(ctx, g, fmt.Sprintf("Lock %s: %s", g.dl.Name, backend.Describe(err)), backendRetry)
	}
}

// readyFence is the fencing token lockwarden's Ready check carries, if it is Ready.
func (g *workloadLock) readyFence() (int64, bool) {
	s := g.checkState()
	if s == nil || s.State != kueue.CheckStateReady {
		return 0, false
	}
	for _, u := range s.PodSetUpdates {
		if f, err := strconv.ParseInt(u.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64); err == nil {
			return f, true
		}
	}
	return 0, false
}

// takeOver renews the lease of a Workload that was admitted with fence
// before the operator restarted, and keeps renewing it; a lease that is gone
// is lost (the check goes to Retry).
func (r *WorkloadReconciler) takeOver(ctx context.Context, g *workloadLock, h backend.Handle, fence int64) (ctrl.Result, error) {
	renewed, err := takeOverLease(ctx, r.Deps, h, g.ref, g.dl, g.keys, g.holder, g.owner, fence)
	switch {
	case err == nil:
		return r.setReady(ctx, g, renewed)
	case errors.Is(err, lock.ErrLost), errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrPreempted):
		metrics.LeasesLost.WithLabelValues(workloadKind).Inc()
		return r.reportLost(ctx, g, err)
	default:
		return ctrl.Result{RequeueAfter: backendRetry}, nil
	}
}

// setReady shows the check Ready with the lease's fencing token and holder
// as annotations of every pod set.
func (r *WorkloadReconciler) setReady(ctx context.Context, g *workloadLock, lease *lock.Lease) (ctrl.Result, error) {
	fence := strconv.FormatInt(lease.Fence, 10)
	updates := make([]kueue.PodSetUpdate, 0, len(g.wl.Spec.PodSets))
	for _, ps := range g.wl.Spec.PodSets {
		updates = append(updates, kueue.PodSetUpdate{Name: ps.Name, Annotations: map[string]string{
			locksv1alpha1.AnnotationFencingToken: fence,
			locksv1alpha1.AnnotationHolder:       g.holder.Identity,
		}})
	}
	return r.setCheck(ctx, g, kueue.CheckStateReady, fmt.Sprintf("Holding lock %s with fencing token %s", g.lockName, fence), updates)
}

// reportLost sets the check of a Workload whose lease was lost to Retry:
// Kueue evicts the Workload (stopping its Job) and queues it again.
func (r *WorkloadReconciler) reportLost(ctx context.Context, g *workloadLock, cause error) (ctrl.Result, error) {
	r.Watchdog.Drop(g.ref)
	r.Registry.Forget(g.ref)
	fence, _ := g.readyFence()
	r.Recorder.Eventf(g.wl, nil, corev1.EventTypeWarning, locksv1alpha1.EventLost, "Renew",
		"Lost the lease of lock %s (fencing token %d): %s; the admission check is set to Retry, so Kueue evicts the Workload and queues it again", g.lockName, fence, backend.Describe(cause))
	if g.job != nil {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: g.job.Namespace, Name: g.job.Name, UID: g.job.UID}}
		r.Recorder.Eventf(job, nil, corev1.EventTypeWarning, locksv1alpha1.EventLost, "Renew",
			"Lost the lease of lock %s (fencing token %d): %s; Kueue evicts the Job's Workload", g.lockName, fence, backend.Describe(cause))
	}
	logf.FromContext(ctx).Info("Workload lost its lease", "fence", fence, "cause", cause.Error())
	return r.setCheck(ctx, g, kueue.CheckStateRetry, fmt.Sprintf("Lost the lease of lock %s (fencing token %d): %s", g.lockName, fence, backend.Describe(cause)), nil)
}

// releaseWorkload releases the lease of a Workload that finished, gave its
// quota back or is being deleted, and leaves the queue. A check left Ready
// is set back to Pending with why (unless the Workload finished): the
// token it carried is no longer valid.
func (r *WorkloadReconciler) releaseWorkload(ctx context.Context, g *workloadLock, why string) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	lease, locker, held := r.Watchdog.Holding(g.ref)
	fence, ready := g.readyFence()
	if !held && g.dl != nil && len(g.keys) > 0 {
		if h, err := r.Registry.For(ctx, g.ref, g.dl); err == nil {
			locker = h.Locker
			lease = &lock.Lease{Keys: g.keys, Owner: g.owner, Holder: g.holder.Encode(), Fence: fence, Limit: int(g.dl.Spec.MaxHolders)}
		}
	}
	if locker != nil && (held || ready || r.isWaiting(client.ObjectKeyFromObject(g.wl))) {
		r.Watchdog.Drop(g.ref)
		until, err := releaseOrCool(ctx, locker, lease, cooldownOf(g.dl), r.Clock.Now())
		switch {
		case err == nil:
			r.Recorder.Eventf(g.wl, nil, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released lock %s (fencing token %d)%s", g.lockName, lease.Fence, cooldownNote(until))
			if g.dl != nil {
				r.Recorder.Eventf(g.dl, g.wl, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released by Workload %s (fencing token %d)%s", g.wl.Name, lease.Fence, cooldownNote(until))
			}
			log.Info("Released lock of Workload", "fence", lease.Fence)
		case errors.Is(err, lock.ErrNotHeld):
		default:
			if held && r.Clock.Now().Before(lease.Expires) {
				return ctrl.Result{}, fmt.Errorf("release lock of Workload (it expires with its TTL): %w", err)
			}
		}
		if err := locker.Dequeue(ctx, lease.Keys, g.owner); err != nil {
			log.V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "error", err.Error())
		}
	}
	r.Registry.Forget(g.ref)
	r.forget(client.ObjectKeyFromObject(g.wl))
	switch {
	case !ready:
		return ctrl.Result{}, nil
	case why != "":
		return r.setCheck(ctx, g, kueue.CheckStatePending, why, nil)
	default:
		// Finished (or being deleted): Kueue keeps the check Ready; it
		// says the lock was released, which later reconciles (a restart of the operator
		// reads every Workload) take as done.
		end := "the Workload finished"
		if !g.wl.DeletionTimestamp.IsZero() {
			end = "the Workload is being deleted"
		}
		return r.setCheck(ctx, g, kueue.CheckStateReady,
			fmt.Sprintf("%s%s (fencing token %d): %s", releasedPrefix, g.lockName, fence, end), g.checkState().PodSetUpdates)
	}
}

// releasedPrefix starts the message of the Ready check of a finished
// Workload whose lock was released.
const releasedPrefix = "Released lock "

// releasedAtFinish tells whether the check of a finished Workload says its
// lock was released.
func (g *workloadLock) releasedAtFinish() bool {
	s := g.checkState()
	return s != nil && s.State == kueue.CheckStateReady && strings.HasPrefix(s.Message, releasedPrefix)
}

// isWaiting tells whether the Workload waits in its lock's queue.
func (r *WorkloadReconciler) isWaiting(nn types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.waitingSince[nn]
	return ok
}

// setPending shows the check Pending with why, looking again after requeue.
func (r *WorkloadReconciler) setPending(ctx context.Context, g *workloadLock, msg string, requeue time.Duration) (ctrl.Result, error) {
	if _, err := r.setCheck(ctx, g, kueue.CheckStatePending, msg, nil); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// setCheck writes lockwarden's admission check state on the Workload when
// it changed: with server-side apply of that one entry of
// status.admissionChecks (a map keyed by name), so that Kueue's and other
// controllers' entries are left as they are.
func (r *WorkloadReconciler) setCheck(ctx context.Context, g *workloadLock, state kueue.CheckState, msg string, updates []kueue.PodSetUpdate) (ctrl.Result, error) {
	cur := g.checkState()
	if cur != nil && cur.State == state && cur.Message == msg && podSetUpdatesEqual(cur.PodSetUpdates, updates) {
		return ctrl.Result{}, nil
	}
	transition := metav1.NewTime(r.Clock.Now())
	if cur != nil && cur.State == state && !cur.LastTransitionTime.IsZero() {
		transition = cur.LastTransitionTime
	}
	entry := map[string]any{
		"name":               string(g.check),
		"state":              string(state),
		"message":            msg,
		"lastTransitionTime": transition.UTC().Format(time.RFC3339),
	}
	if len(updates) > 0 {
		var list []any
		for _, u := range updates {
			ann := map[string]any{}
			for k, v := range u.Annotations {
				ann[k] = v
			}
			list = append(list, map[string]any{"name": string(u.Name), "annotations": ann})
		}
		entry["podSetUpdates"] = list
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.GroupVersion.WithKind("Workload"))
	u.SetNamespace(g.wl.Namespace)
	u.SetName(g.wl.Name)
	if err := unstructured.SetNestedSlice(u.Object, []any{entry}, "status", "admissionChecks"); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(kueueFieldOwner), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("set admission check %s to %s: %w", g.check, state, err)
	}
	logf.FromContext(ctx).V(1).Info("Set admission check", "check", g.check, "state", state, "message", msg)
	return ctrl.Result{}, nil
}

func podSetUpdatesEqual(a, b []kueue.PodSetUpdate) bool {
	return slices.EqualFunc(a, b, func(x, y kueue.PodSetUpdate) bool {
		return x.Name == y.Name && maps.Equal(x.Annotations, y.Annotations) && len(x.Labels) == len(y.Labels) &&
			len(x.NodeSelector) == len(y.NodeSelector) && len(x.Tolerations) == len(y.Tolerations)
	})
}

// LeanWorkload is the cache transform of Workloads: the admission check
// needs their pod sets' names, never their pod templates, which make up
// most of a Workload.
func LeanWorkload(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	if wl, ok := obj.(*kueue.Workload); ok {
		for i := range wl.Spec.PodSets {
			wl.Spec.PodSets[i].Template = corev1.PodTemplateSpec{}
		}
	}
	return obj, nil
}

// AdmissionCheckReconciler marks lockwarden's AdmissionChecks (controllerName
// KueueControllerName) Active, which Kueue requires of a check's controller
// before it admits through it.
type AdmissionCheckReconciler struct {
	Client client.Client
}

// SetupWithManager registers the reconciler.
func (r *AdmissionCheckReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&kueue.AdmissionCheck{}).Named("kueue-admissioncheck").Complete(r)
}

// Reconcile sets Active=True on an AdmissionCheck that lockwarden answers.
func (r *AdmissionCheckReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ac kueue.AdmissionCheck
	if err := r.Client.Get(ctx, req.NamespacedName, &ac); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ac.Spec.ControllerName != KueueControllerName {
		return ctrl.Result{}, nil
	}
	before := ac.DeepCopy()
	if !apimeta.SetStatusCondition(&ac.Status.Conditions, metav1.Condition{
		Type: kueue.AdmissionCheckActive, Status: metav1.ConditionTrue, Reason: "Active", ObservedGeneration: ac.Generation,
		Message: "lockwarden admits a Workload while it holds the lock its Job names (annotation lockwarden.io/lock)",
	}) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, &ac, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("mark AdmissionCheck active: %w", err)
	}
	logf.FromContext(ctx).Info("Marked AdmissionCheck active")
	return ctrl.Result{}, nil
}

// workloadOrphaned says why the lease held for the Workload nn has no holder
// any more ("" when it has one), for the sweep of orphaned leases.
func workloadOrphaned(ctx context.Context, c client.Reader, nn types.NamespacedName, lease *lock.Lease) (client.Object, string, error) {
	var wl kueue.Workload
	if err := c.Get(ctx, nn, &wl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "the Workload is gone", nil
		}
		return nil, "", err
	}
	if string(wl.UID) != holder.Decode(lease.Holder).UID {
		return nil, "the Workload was replaced by another of the same name", nil
	}
	return &wl, "", nil
}
