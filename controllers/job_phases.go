package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// lockMissingRequeue is how soon a Job whose lock does not exist is looked at again.
const lockMissingRequeue = 30 * time.Second

// reconcileWaiting tries to acquire the lock for a suspended Job; on success
// it hands the Job the fencing token and unsuspends it. A Job that waited
// past its maximum wait, or that a newer Job of its CronJob supersedes
// (contention QueueLatest), ends without running.
func (r *JobReconciler) reconcileWaiting(ctx context.Context, g *gatedJob) (ctrl.Result, error) {
	job := g.job
	if g.dl == nil {
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventLockNotFound, "Wait",
			"DistributedLock %q does not exist in namespace %q; the Job stays suspended until it does", job.Labels[locksv1alpha1.LabelLock], job.Namespace)
		return ctrl.Result{RequeueAfter: lockMissingRequeue}, nil
	}
	if lease, _, held := r.Watchdog.Holding(g.ref); held {
		// Acquired already, but the Job seen here does not show it yet (the
		// cache lags behind the start patch, or that patch failed): start it
		// with the lease held, never acquire again (that would issue a new
		// fencing token while the Job may already run with this one).
		return r.startJob(ctx, g, lease)
	}
	if job.Spec.Suspend == nil || !*job.Spec.Suspend {
		// Someone unsuspended the Job without the lock: suspend it again.
		before := job.DeepCopy()
		suspend := true
		job.Spec.Suspend = &suspend
		if err := r.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("suspend Job: %w", err)
		}
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventUnsuspendedWithoutLock, "Suspend",
			"The Job was unsuspended before it held lock %s; it waits for its turn", g.dl.Name)
	}
	limit, deadline := maxWait(job, g.dl)
	if limit > 0 && !r.Clock.Now().Before(deadline) {
		return r.end(ctx, g, ending{reason: locksv1alpha1.JobReasonWaitTimedOut, eventType: corev1.EventTypeWarning,
			note: fmt.Sprintf("Waited for lock %s since %s, longer than its maximum wait of %v; the Job ends without running",
				g.dl.Name, job.CreationTimestamp.UTC().Format(time.RFC3339), limit)})
	}
	contention := contentionOf(g)
	if contention == locksv1alpha1.ContentionQueueLatest {
		if res, done, err := r.supersedeOlder(ctx, g); done || err != nil {
			return res, err
		}
	}
	if busy, due, ok := r.waits.takePlace(client.ObjectKeyFromObject(job), r.Clock.Now(), r.requeueWaiting()); ok {
		// Woken to show its new place, read from the store for all the
		// waiters of the key at once (see wakeTurn): no call of its own.
		// It tries again when the attempt that keeps its place is due.
		res, err := r.wait(ctx, g, busy)
		if err == nil {
			res.RequeueAfter = max(due.Sub(r.Clock.Now()), time.Millisecond)
		}
		return untilDeadline(res, limit, deadline, r.Clock.Now()), err
	}
	if g.keysErr != nil {
		// Only a Job admitted before its lock derived keys lacks one: it
		// waits, and says why, until it is deleted.
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventNoKey, "Acquire", "The Job cannot take lock %s: %v", g.dl.Name, g.keysErr)
		return ctrl.Result{}, nil
	}
	h, res, ok := r.backendFor(ctx, g, "Acquire")
	if !ok {
		return untilDeadline(res, limit, deadline, r.Clock.Now()), nil
	}
	req := lock.Request{Keys: g.keys, TTL: lockTTL(g.dl), Owner: g.owner, Holder: g.holder.Encode(),
		Queue: contention != locksv1alpha1.ContentionSkip, Limit: int(g.dl.Spec.MaxHolders),
		Replace: contention == locksv1alpha1.ContentionReplaceQueued || contention == locksv1alpha1.ContentionCancelInProgress,
		Weight:  backend.WorkloadWeight(job.Annotations)}
	if req.Queue {
		req.Boost = backend.Boost(g.dl, backend.WorkloadPriority(job.Annotations, job.Spec.Template.Spec.Priority))
	}
	lease, err := h.Locker.TryAcquire(ctx, req)
	var busy *lock.HeldError
	if errors.As(err, &busy) && contention == locksv1alpha1.ContentionCancelInProgress && cancellable(g, busy) {
		// The running Job of its lane is stopped: its lease is no longer
		// renewed, and it is released once its pods stop (handleCancelled).
		req.Preempt = true
		if lease, err = h.Locker.TryAcquire(ctx, req); errors.As(err, &busy) {
			r.eventf(job, corev1.EventTypeNormal, locksv1alpha1.EventCancelling, "Acquire",
				"Asked %s, the running Job of lock %s, to stop (contention CancelInProgress); this Job starts once it has released the lock",
				describeHolder(holder.Decode(busy.Holder).Identity, busy.Fence), g.dl.Name)
		}
	}
	var invalid *lock.InvalidRequestError
	switch {
	case err == nil:
		return r.start(ctx, g, h, lease)
	case errors.Is(err, lock.ErrReplaced):
		metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultBusy).Inc()
		return r.end(ctx, g, ending{reason: locksv1alpha1.JobReasonReplaced, eventType: corev1.EventTypeNormal,
			note: fmt.Sprintf("Replaced in the queue of lock %s by a newer workload of the same key (contention ReplaceQueued or CancelInProgress); the Job ends without running", g.dl.Name)})
	case errors.As(err, &busy) && contention == locksv1alpha1.ContentionSkip:
		metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultBusy).Inc()
		return r.skip(ctx, g, busy)
	case errors.As(err, &busy):
		metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultBusy).Inc()
		r.waits.triedAt(client.ObjectKeyFromObject(job), r.Clock.Now())
		res, err := r.wait(ctx, g, busy)
		return untilDeadline(res, limit, deadline, r.Clock.Now()), err
	case errors.As(err, &invalid):
		// The lock asks for what its backend refuses (every store has
		// semaphores today; a store may still refuse a request):
		// retrying soon does not help; a change of the lock's spec or
		// backend wakes the Job.
		metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultError).Inc()
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.ReasonInvalidBackend, "Acquire",
			"Lock %s cannot be acquired: %s; the Job stays suspended until the lock or its backend changes", g.dl.Name, invalid.Error())
		return untilDeadline(ctrl.Result{RequeueAfter: lockMissingRequeue}, limit, deadline, r.Clock.Now()), nil
	default:
		metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultError).Inc()
		logf.FromContext(ctx).Error(err, "Acquiring lock failed", "lock", g.dl.Name)
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventBackendUnavailable, "Acquire", "Lock %s: %s", g.dl.Name, backend.Describe(err))
		return untilDeadline(ctrl.Result{RequeueAfter: backendRetry}, limit, deadline, r.Clock.Now()), nil
	}
}

// cancellable tells whether a Job with contention CancelInProgress may stop
// the holder that keeps it waiting: only a running Job of the same lock
// (in any cluster sharing the store) on a lock of one key per workload.
// A manual holder, a hold window, a Pod or another lock's workload sharing
// a Global key is waited for, never stopped; with several fixed keys the
// store would stop the holders of every busy key, not only the one named,
// so such a lock waits as with ReplaceQueued.
func cancellable(g *gatedJob, busy *lock.HeldError) bool {
	if busy.Holder == "" || len(g.keys) != 1 || g.dl.Spec.MaxHolders > 1 {
		return false
	}
	hd := holder.Decode(busy.Holder)
	return hd.Kind == jobKind && hd.Namespace == g.job.Namespace && hd.Lock == g.dl.Name && hd.UID != string(g.job.UID)
}

// contentionOf is the Job's contention: its annotation, else its lock's.
func contentionOf(g *gatedJob) locksv1alpha1.Contention {
	if c := locksv1alpha1.Contention(g.job.Annotations[locksv1alpha1.AnnotationContention]); c != "" {
		return c
	}
	return g.dl.Spec.Contention
}

func lockTTL(dl *locksv1alpha1.DistributedLock) time.Duration {
	return time.Duration(dl.Spec.TTLSeconds) * time.Second
}

// maxWait is how long the Job may wait for its lock (0: no bound) and when
// that ends, counted from the Job's creation so that it holds across
// restarts of the operator. The Job's lockwarden.io/max-wait annotation (the
// admission webhook copies its CronJob's there) wins over the lock's
// spec.maxWaitSeconds; an annotation that is not a positive duration (the
// webhook refuses those) is ignored.
func maxWait(job *batchv1.Job, dl *locksv1alpha1.DistributedLock) (time.Duration, time.Time) {
	var limit time.Duration
	if d, err := time.ParseDuration(job.Annotations[locksv1alpha1.AnnotationMaxWait]); err == nil && d > 0 {
		limit = d
	} else if dl != nil && dl.Spec.MaxWaitSeconds > 0 {
		limit = time.Duration(dl.Spec.MaxWaitSeconds) * time.Second
	}
	if limit == 0 {
		return 0, time.Time{}
	}
	return limit, job.CreationTimestamp.Add(limit)
}

// untilDeadline shortens a waiting Job's requeue so that it ends at its
// maximum wait, not up to a requeue period later.
func untilDeadline(res ctrl.Result, limit time.Duration, deadline, now time.Time) ctrl.Result {
	if limit == 0 || res.RequeueAfter == 0 {
		return res
	}
	if left := deadline.Sub(now); left < res.RequeueAfter {
		res.RequeueAfter = max(left, time.Millisecond)
	}
	return res
}

// Every handover moves each waiter of the lock one place up, and showing
// that costs an API write (and an Event) per waiter: O(N) writes on the
// manager's one API client, which every tenant shares. A namespace gets at
// most showRate of these writes a second (burst showBurst, enough to show a
// queue of that many at once); over it, its Jobs keep showing their old
// place until their next periodic attempt. Only what is shown waits: the
// order of the queue and every acquisition, release and renewal are not
// held by it.
const (
	showRate  = 20
	showBurst = 200
)

// wait shows a Job that waits in the queue where it is: the queue-position
// and waiting-for annotations, updated when they change, and a Waiting
// Event when its position changes, within its namespace's share of these
// writes (showRate).
func (r *JobReconciler) wait(ctx context.Context, g *gatedJob, busy *lock.HeldError) (ctrl.Result, error) {
	job := g.job
	nn := client.ObjectKeyFromObject(job)
	if r.startWaiting(nn, r.Clock.Now()) {
		r.notifyLock(job)
	}
	position, waitingFor := describeWait(busy)
	seen := waitShown{job.Annotations[locksv1alpha1.AnnotationQueuePosition], job.Annotations[locksv1alpha1.AnnotationWaitingFor]}
	want := waitShown{position, waitingFor}
	if (seen != want || r.waits.positionDiffers(nn, position)) && r.shows != nil && !r.shows.allow(job.Namespace, r.Clock.Now()) {
		metrics.ShowsDeferred.Inc()
		logf.FromContext(ctx).V(1).Info("Waiting for lock; the namespace used its share of queue-position writes, shown later", "lock", g.dl.Name, "position", position)
		return ctrl.Result{RequeueAfter: r.requeueWaiting()}, nil
	}
	if r.waits.positionChanged(nn, position) {
		hd := holder.Decode(busy.Holder)
		where := ""
		if position != "" {
			where = fmt.Sprintf("position %d of %d, ", busy.Position+1, max(busy.Waiters, busy.Position+1))
		}
		r.eventf(job, corev1.EventTypeNormal, locksv1alpha1.EventWaiting, "Acquire", "Waiting for lock %s: %sbehind %s", g.dl.Name, where, describeHolder(hd.Identity, busy.Fence))
	}
	logf.FromContext(ctx).V(1).Info("Waiting for lock", "lock", g.dl.Name, "position", position)
	if seen != want {
		tampered := r.waits.tampered(nn, seen, want)
		// Only these two keys: no optimistic lock needed, and a Job that
		// started meanwhile is not touched otherwise.
		before := job.DeepCopy()
		setOrDelete(&job.ObjectMeta, locksv1alpha1.AnnotationQueuePosition, position)
		setOrDelete(&job.ObjectMeta, locksv1alpha1.AnnotationWaitingFor, waitingFor)
		r.waits.willWrite(nn, want)
		if err := r.Client.Patch(ctx, job, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("show the Job's place in the queue: %w", err)
		}
		r.waits.wroteShown(nn, want)
		if tampered {
			r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventTampered, "Restore",
				"The Job's lockwarden annotations were changed by someone other than lockwarden; restored its place in the queue of lock %s (%s)", g.dl.Name, position)
		}
	}
	return ctrl.Result{RequeueAfter: r.requeueWaiting()}, nil
}

// describeWait returns a waiting Job's queue-position annotation
// ("position/length", 1 = next; empty when it is not queued) and its
// waiting-for annotation.
func describeWait(busy *lock.HeldError) (position, waitingFor string) {
	if busy.Position >= 0 {
		position = fmt.Sprintf("%d/%d", busy.Position+1, max(busy.Waiters, busy.Position+1))
	}
	var parts []string
	if busy.Holder != "" {
		held := "held by " + describeHolder(holder.Decode(busy.Holder).Identity, busy.Fence)
		if busy.Holders > 1 {
			held += fmt.Sprintf(" and %d other holder(s)", busy.Holders-1)
		}
		parts = append(parts, held)
	}
	if busy.Position > 0 {
		parts = append(parts, fmt.Sprintf("%d waiter(s) ahead", busy.Position))
	}
	if len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("key %s is busy", busy.Key))
	}
	return position, strings.Join(parts, ", ")
}

func setOrDelete(m *metav1.ObjectMeta, k, v string) {
	if v == "" {
		delete(m.Annotations, k)
		return
	}
	setAnnotation(m, k, v)
}

// supersedeOlder applies contention QueueLatest: among the waiting Jobs of
// one CronJob on this lock only the newest (by creation, then name) keeps
// waiting. A Job with a newer waiting sibling ends (done); the newest wakes
// its older siblings, which end at once. Running Jobs are not waiting and
// are never affected; a Job without a CronJob waits as with Queue.
func (r *JobReconciler) supersedeOlder(ctx context.Context, g *gatedJob) (res ctrl.Result, done bool, err error) {
	job := g.job
	cj := cronJobOf(job)
	if cj == nil {
		return ctrl.Result{}, false, nil
	}
	var jobs batchv1.JobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(job.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: g.dl.Name}); err != nil {
		return ctrl.Result{}, false, fmt.Errorf("list the Jobs of lock %s: %w", g.dl.Name, err)
	}
	var newest *batchv1.Job
	var older []types.NamespacedName
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.UID == job.UID || phaseOf(j) != phaseWaiting || r.waits.hasEnded(j) {
			continue
		}
		if o := cronJobOf(j); o == nil || o.UID != cj.UID {
			continue
		}
		if _, _, held := r.Watchdog.Holding(jobRef(j)); held {
			continue // acquired; its start is on its way
		}
		switch {
		case newerJob(j, job) && (newest == nil || newerJob(j, newest)):
			newest = j
		case newerJob(job, j):
			older = append(older, client.ObjectKeyFromObject(j))
		}
	}
	if newest == nil {
		for _, nn := range older {
			r.enqueue(nn)
		}
		return ctrl.Result{}, false, nil
	}
	res, err = r.end(ctx, g, ending{reason: locksv1alpha1.JobReasonSuperseded, eventType: corev1.EventTypeNormal,
		note: fmt.Sprintf("Superseded by the newer Job %s of CronJob %s, which waits for lock %s in its place (contention QueueLatest); the Job ends without running", newest.Name, cj.Name, g.dl.Name)})
	return res, true, err
}

// newerJob tells whether a was created after b (by creation time, then name).
func newerJob(a, b *batchv1.Job) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// ending is why a waiting Job ends without running.
type ending struct {
	// reason is the FailureTarget condition's reason and the Event's
	// (JobReasonSkipped, JobReasonWaitTimedOut, JobReasonSuperseded).
	reason    string
	eventType string
	// note is the condition's message and the Event's.
	note string
	// annotations are set on the Job with the removal of its finalizer.
	annotations map[string]string
}

// end makes a waiting Job terminal without ever running it: it leaves the
// queue, says why in an Event (on the Job and on its CronJob), and adds a
// FailureTarget condition with the reason to the Job's status, with the
// startTime a finished Job needs. kube-controller-manager's Job controller
// turns the FailureTarget into Failed with the same reason and message;
// the Job is never unsuspended, so it never has a pod. Then the Job is done
// with as a finished one: its finalizer and waiting annotations are removed.
func (r *JobReconciler) end(ctx context.Context, g *gatedJob, e ending) (ctrl.Result, error) {
	job := g.job
	if h, err := r.Registry.For(ctx, g.ref, g.dl); err == nil && h.Locker != nil && len(g.keys) > 0 {
		if err := h.Locker.Dequeue(ctx, g.keys, g.owner); err != nil {
			logf.FromContext(ctx).V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "error", err.Error())
		}
	}
	r.eventf(job, e.eventType, e.reason, "End", "%s", e.note)
	if cj := cronJobOf(job); cj != nil {
		r.eventf(cj, e.eventType, e.reason, "End", "Job %s: %s", job.Name, e.note)
	}
	before := job.DeepCopy()
	now := metav1.NewTime(r.Clock.Now())
	if job.Status.StartTime == nil {
		job.Status.StartTime = &now // kube-apiserver refuses a Failed Job without one
	}
	job.Status.Conditions = append(job.Status.Conditions, batchv1.JobCondition{
		Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: e.reason, Message: e.note, LastProbeTime: now, LastTransitionTime: now,
	})
	if err := r.Client.Status().Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("mark the Job %s: %w", e.reason, err)
	}
	r.waits.markEnded(job)
	r.notifyLock(job)
	// It left the queue: release (below) wakes the waiter whose turn that makes it.
	logf.FromContext(ctx).Info("Ended waiting Job without running it", "lock", g.dl.Name, "reason", e.reason)
	return r.release(ctx, g, e.annotations)
}

// start hands an acquired lease to the watchdog and starts the Job.
func (r *JobReconciler) start(ctx context.Context, g *gatedJob, h backend.Handle, lease *lock.Lease) (ctrl.Result, error) {
	r.Watchdog.Hold(g.ref, h.Locker, lease)
	metrics.Acquisitions.WithLabelValues(jobKind, metrics.ResultAcquired).Inc()
	since := r.stopWaiting(client.ObjectKeyFromObject(g.job), lease.Acquired)
	r.waits.stopWaiting(client.ObjectKeyFromObject(g.job))
	metrics.WaitSeconds.WithLabelValues(jobKind).Observe(r.Clock.Since(since).Seconds())
	logf.FromContext(ctx).Info("Acquired lock for Job", "lock", g.dl.Name, "fence", lease.Fence)
	res, err := r.startJob(ctx, g, lease)
	if err != nil {
		return res, err // still held and renewed: the next reconcile starts it with this lease
	}
	r.eventf(g.job, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Acquired lock %s with fencing token %d; started", g.dl.Name, lease.Fence)
	// The others moved up, but none of them may acquire now. Waking each
	// to try the store (TryAcquire, a quorum write on ZooKeeper and etcd)
	// only to learn its new place would cost one call per waiter at every
	// handover. Instead one Inspect of the key reads the places of the
	// waiters at the head of the queue (the ones it lists), which their
	// reconciles show without a call (wakeTurn, takePlace); the places of
	// the waiters further back catch up at their periodic requeue, which
	// keeps their place in the queue anyway.
	r.wakeLock(g)
	r.Recorder.Eventf(g.dl, g.job, corev1.EventTypeNormal, locksv1alpha1.EventAcquired, "Acquire", "Acquired by Job %s with fencing token %d", g.job.Name, lease.Fence)
	return res, nil
}

// startJob records the fencing token on the Job and its pod template and
// unsuspends it. The patch carries the Job's resourceVersion: it never
// applies to a newer Job than the one seen.
func (r *JobReconciler) startJob(ctx context.Context, g *gatedJob, lease *lock.Lease) (ctrl.Result, error) {
	job := g.job
	before := job.DeepCopy()
	fence := strconv.FormatInt(lease.Fence, 10)
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationFencingToken, fence)
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationHolder, g.holder.Identity)
	setAnnotation(&job.Spec.Template.ObjectMeta, locksv1alpha1.AnnotationFencingToken, fence)
	setAnnotation(&job.Spec.Template.ObjectMeta, locksv1alpha1.AnnotationHolder, g.holder.Identity)
	delete(job.Annotations, locksv1alpha1.AnnotationQueuePosition)
	delete(job.Annotations, locksv1alpha1.AnnotationWaitingFor)
	suspend := false
	job.Spec.Suspend = &suspend
	if err := r.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		// Still held and renewed: the next reconcile starts it with the same lease.
		return ctrl.Result{}, fmt.Errorf("start Job with fencing token %d: %w", lease.Fence, err)
	}
	r.notifyLock(job)
	return ctrl.Result{}, nil
}

func setAnnotation(m *metav1.ObjectMeta, k, v string) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[k] = v
}

// skip records why a Job with contention Skip does not run. A plain Job
// ends Failed with reason Skipped (see end), the reason also in its
// lockwarden.io/skipped annotation; a CronJob's Job is deleted (its run is
// skipped, as the CronJob's events say).
func (r *JobReconciler) skip(ctx context.Context, g *gatedJob, busy *lock.HeldError) (ctrl.Result, error) {
	job := g.job
	hd := holder.Decode(busy.Holder)
	reason := fmt.Sprintf("lock %s is held by %s", g.dl.Name, describeHolder(hd.Identity, busy.Fence))
	cj := cronJobOf(job)
	if cj == nil {
		return r.end(ctx, g, ending{reason: locksv1alpha1.JobReasonSkipped, eventType: corev1.EventTypeNormal,
			note: fmt.Sprintf("Not run: %s (contention Skip)", reason), annotations: map[string]string{locksv1alpha1.AnnotationSkipped: reason}})
	}
	r.eventf(job, corev1.EventTypeNormal, locksv1alpha1.EventSkipped, "Skip", "Not run: %s (contention Skip)", reason)
	r.eventf(cj, corev1.EventTypeNormal, locksv1alpha1.EventSkipped, "Skip", "Skipped Job %s: %s (contention Skip)", job.Name, reason)
	before := job.DeepCopy()
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationSkipped, reason)
	controllerutil.RemoveFinalizer(job, locksv1alpha1.Finalizer)
	if err := r.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("mark Job skipped: %w", err)
	}
	r.Registry.Forget(g.ref)
	if err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("delete skipped Job: %w", err)
	}
	logf.FromContext(ctx).Info("Skipped Job", "reason", reason)
	return ctrl.Result{}, nil
}

// reconcileHeld keeps the lease of a running Job renewed; after a restart of
// the operator it takes the lease over with the same owner token and fence.
func (r *JobReconciler) reconcileHeld(ctx context.Context, g *gatedJob) (ctrl.Result, error) {
	if l, ok := r.lostOf(client.ObjectKeyFromObject(g.job)); ok {
		res, err := r.handleLost(ctx, g, lostCause(l))
		if err == nil {
			r.clearLost(client.ObjectKeyFromObject(g.job), l)
		}
		return res, err
	}
	if lease, _, ok := r.Watchdog.Holding(g.ref); ok {
		return r.restoreToken(ctx, g, lease)
	}
	if g.dl == nil {
		metrics.LeasesLost.WithLabelValues(jobKind).Inc()
		return r.handleLost(ctx, g, fmt.Errorf("%w: DistributedLock %q was deleted", lock.ErrLost, g.job.Labels[locksv1alpha1.LabelLock]))
	}
	// Until the backend answers, the watchdog does not renew this lease:
	// backendFor says so; the lease is lost if that takes a TTL.
	h, res, ok := r.backendFor(ctx, g, "Renew")
	if !ok {
		return res, nil
	}
	fence, _ := strconv.ParseInt(g.job.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	_, err := takeOverLease(ctx, r.Deps, h, g.ref, g.dl, g.keys, g.holder, g.owner, fence)
	switch {
	case err == nil:
		return ctrl.Result{}, nil
	case errors.Is(err, lock.ErrPreempted):
		return r.cancel(ctx, g, err)
	case errors.Is(err, lock.ErrLost), errors.Is(err, lock.ErrNotHeld):
		metrics.LeasesLost.WithLabelValues(jobKind).Inc()
		return r.handleLost(ctx, g, err)
	default:
		logf.FromContext(ctx).Error(err, "Taking over the lease of a running Job failed; retrying", "lock", g.dl.Name)
		return ctrl.Result{RequeueAfter: backendRetry}, nil
	}
}

// takeOverLease renews, with the same owner token, the lease a holder took
// with fence before the operator restarted, and hands it to the watchdog,
// which renews it from then on. It never acquires: a holder that may run
// with fence must not be given another token.
func takeOverLease(ctx context.Context, d Deps, h backend.Handle, ref holder.Ref, dl *locksv1alpha1.DistributedLock, keys []string, hd holder.Holder, owner string, fence int64) (*lock.Lease, error) {
	ttl := lockTTL(dl)
	renewed, err := h.Locker.Renew(ctx, &lock.Lease{Keys: keys, Owner: owner, Holder: hd.Encode(), Fence: fence, TTL: ttl, Limit: int(dl.Spec.MaxHolders)}, ttl)
	if err != nil {
		return nil, err
	}
	if renewed.Fence == 0 {
		renewed.Fence = fence
	}
	d.Watchdog.Hold(ref, h.Locker, renewed)
	logf.FromContext(ctx).Info("Recovered held lease", "holder", ref, "fence", fence)
	return renewed, nil
}

// busyRequeueBase is about how soon a reconcile whose backend had no free
// slot (backend.ErrBusy) comes back.
const busyRequeueBase = 500 * time.Millisecond

// busyRequeue is busyRequeueBase with up to as much again of jitter, so
// that the reconciles turned away together do not come back together.
func busyRequeue() time.Duration { return wait.Jitter(busyRequeueBase, 1) }

// connectingRequeue is how soon a holder whose backend is new looks again,
// if the backend's first health check has not woken it before.
const connectingRequeue = time.Second

// backendFor returns the Job's backend when the lock may use it and it
// answers (see holderBackend).
func (r *JobReconciler) backendFor(ctx context.Context, g *gatedJob, action string) (backend.Handle, ctrl.Result, bool) {
	return holderBackend(ctx, r.Deps, holderUse{ref: g.ref, dl: g.dl, obj: g.job, leaves: &g.leaves, stays: "the Job stays suspended"}, action)
}

// holderUse is a holder's use of its lock's backend in one reconcile.
type holderUse struct {
	ref holder.Ref
	dl  *locksv1alpha1.DistributedLock
	// obj is told (Events) why the backend cannot be used.
	obj client.Object
	// leaves collects the backend slots the reconcile took.
	leaves *[]func()
	// stays says what happens to the holder meanwhile, for Events.
	stays string
}

// holderBackend returns a holder's backend when the lock may use it and it
// answers. Otherwise it tells the holder why (the policy's refusal, or the
// backend's failure as a category, never the peer's bytes) and returns when
// to look again; a backend known to be down fails at once, without a
// connection attempt, so that unreachable backends do not hold the shared
// workers.
func holderBackend(ctx context.Context, d Deps, u holderUse, action string) (backend.Handle, ctrl.Result, bool) {
	h, err := d.Registry.For(ctx, u.ref, u.dl)
	if err == nil {
		err = h.Health()
	}
	var pe *backend.PolicyError
	switch {
	case err == nil:
		// One slow backend may hold only its share of the shared workers.
		if len(*u.leaves) > 0 {
			return h, ctrl.Result{}, true // this reconcile holds a slot already
		}
		leave, ok := h.Enter()
		if !ok {
			return h, ctrl.Result{RequeueAfter: busyRequeue()}, false
		}
		*u.leaves = append(*u.leaves, leave)
		return h, ctrl.Result{}, true
	case errors.Is(err, backend.ErrConnecting):
		return h, ctrl.Result{RequeueAfter: connectingRequeue}, false
	case errors.As(err, &pe):
		reason := locksv1alpha1.EventBackendNotAllowed
		if pe.Reason == locksv1alpha1.ReasonScopeNotAllowed {
			reason = locksv1alpha1.EventScopeNotAllowed
		}
		d.Recorder.Eventf(u.obj, nil, corev1.EventTypeWarning, reason, action, "Lock %s cannot be acquired: %s; %s", u.dl.Name, pe.Error(), u.stays)
		return h, ctrl.Result{RequeueAfter: lockMissingRequeue}, false
	default:
		d.Recorder.Eventf(u.obj, nil, corev1.EventTypeWarning, locksv1alpha1.EventBackendUnavailable, action, "Lock %s: %s", u.dl.Name, backend.Describe(err))
		logf.FromContext(ctx).V(1).Info("Backend of the holder's lock is not usable; retrying", "lock", u.dl.Name, "error", err.Error())
		if h.Locker != nil && action == "Acquire" {
			// Known to be down: its recovery wakes the waiting Jobs
			// (onHealth); waiting Pods try again at their own pace. Retrying
			// sooner would cost the shared workers.
			return h, ctrl.Result{RequeueAfter: lockMissingRequeue}, false
		}
		return h, ctrl.Result{RequeueAfter: backendRetry}, false
	}
}

// restoreToken puts back the fencing token and holder annotations of a
// running Job when someone else changed them: what the operator believes
// comes from the lease it renews, and the Job shows that. (The shipped
// admission policy refuses such edits; this covers clusters without it.)
func (r *JobReconciler) restoreToken(ctx context.Context, g *gatedJob, lease *lock.Lease) (ctrl.Result, error) {
	job := g.job
	fence := strconv.FormatInt(lease.Fence, 10)
	if job.Annotations[locksv1alpha1.AnnotationFencingToken] == fence && job.Annotations[locksv1alpha1.AnnotationHolder] == g.holder.Identity {
		return ctrl.Result{}, nil
	}
	before := job.DeepCopy()
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationFencingToken, fence)
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationHolder, g.holder.Identity)
	if err := r.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("restore the fencing token annotations: %w", err)
	}
	r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventTampered, "Restore",
		"The Job's lockwarden annotations were changed by someone other than lockwarden; restored fencing token %d of lock %s", lease.Fence, job.Labels[locksv1alpha1.LabelLock])
	return ctrl.Result{}, nil
}

// lostCause is the error a lost lease is reported with.
func lostCause(l watchdog.Lost) error {
	if l.Err == nil {
		return lock.ErrLost
	}
	return l.Err
}

// handleLost records a running Job's lost lease on the Job, then reports it
// and applies the lock's onLost. Who detected the loss counts it. A lease
// that a newer Job preempted is not lost: the Job is cancelled.
func (r *JobReconciler) handleLost(ctx context.Context, g *gatedJob, cause error) (ctrl.Result, error) {
	if errors.Is(cause, lock.ErrPreempted) {
		return r.cancel(ctx, g, cause)
	}
	job := g.job
	r.Watchdog.Drop(g.ref)
	fence := job.Annotations[locksv1alpha1.AnnotationFencingToken]
	before := job.DeepCopy()
	setAnnotation(&job.ObjectMeta, locksv1alpha1.AnnotationLost, fmt.Sprintf("%s: %s", r.Clock.Now().UTC().Format(time.RFC3339), backend.Describe(cause)))
	terminate := g.dl != nil && g.dl.Spec.OnLost == locksv1alpha1.OnLostTerminate
	if terminate {
		suspend := true
		job.Spec.Suspend = &suspend // the Job controller stops its pods
	}
	if err := r.Client.Patch(ctx, job, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("record lost lease: %w", err)
	}
	r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventLost, "Renew", "Lost the lease of lock %s (fencing token %s): %s", job.Labels[locksv1alpha1.LabelLock], fence, backend.Describe(cause))
	if terminate {
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventTerminated, "Terminate", "Stopped the Job's pods: its lease was lost and the lock's onLost is Terminate")
	}
	logf.FromContext(ctx).Info("Job lost its lease", "fence", fence, "terminate", terminate, "cause", cause.Error())
	return ctrl.Result{}, nil
}

// cancel stops a running Job whose lease a newer Job of its lock preempted
// (contention CancelInProgress): its lease is no longer renewed but still
// holds the key until its Expires. A FailureTarget condition (reason
// Cancelled) makes kube-controller-manager's Job controller stop its pods
// within their termination grace period and mark it Failed; the Job is then
// done with (phaseDone), and its lease is released once its pods have
// stopped (holdWhilePodsRun), so that the newer Job never runs beside
// them while the lease lasts. Past the lease's TTL the key is the newer
// Job's anyway, and the fencing token tells the old writer apart.
func (r *JobReconciler) cancel(ctx context.Context, g *gatedJob, cause error) (ctrl.Result, error) {
	job := g.job
	r.Watchdog.Drop(g.ref)
	if jobCancelled(job) || jobFinished(job) {
		return ctrl.Result{}, nil
	}
	lockName := job.Labels[locksv1alpha1.LabelLock]
	fence := job.Annotations[locksv1alpha1.AnnotationFencingToken]
	note := fmt.Sprintf("A newer Job of lock %s asked for its key (contention CancelInProgress): the Job's pods are stopped, then the lock (fencing token %s) is released", lockName, fence)
	before := job.DeepCopy()
	now := metav1.NewTime(r.Clock.Now())
	job.Status.Conditions = append(job.Status.Conditions, batchv1.JobCondition{
		Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonCancelled,
		Message: note, LastProbeTime: now, LastTransitionTime: now,
	})
	if err := r.Client.Status().Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("mark the cancelled Job failed to stop its pods: %w", err)
	}
	r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventCancelled, "Cancel", "%s", note)
	if cj := cronJobOf(job); cj != nil {
		r.eventf(cj, corev1.EventTypeWarning, locksv1alpha1.EventCancelled, "Cancel", "Job %s: %s", job.Name, note)
	}
	if g.dl != nil {
		r.Recorder.Eventf(g.dl, job, corev1.EventTypeNormal, locksv1alpha1.EventCancelled, "Cancel",
			"Job %s (fencing token %s) is stopped: a newer Job asked for its key (contention CancelInProgress)", job.Name, fence)
	}
	logf.FromContext(ctx).Info("Cancelled running Job: its lease was preempted", "fence", fence, "cause", cause.Error())
	return ctrl.Result{}, nil
}

// jobCancelled tells whether the Job was cancelled by a newer Job of its
// lock (contention CancelInProgress): its FailureTarget condition has
// reason Cancelled. Its lease is no longer renewed.
func jobCancelled(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailureTarget && c.Status == corev1.ConditionTrue && c.Reason == locksv1alpha1.JobReasonCancelled {
			return true
		}
	}
	return false
}

// reconcileRelease releases the lease of a finished, ended or deleted Job,
// leaves the queue, and removes the finalizer.
func (r *JobReconciler) reconcileRelease(ctx context.Context, g *gatedJob) (ctrl.Result, error) {
	return r.release(ctx, g, nil)
}

// release is reconcileRelease; it also sets the given annotations on the
// Job with the removal of its finalizer and waiting annotations.
func (r *JobReconciler) release(ctx context.Context, g *gatedJob, annotations map[string]string) (ctrl.Result, error) {
	job := g.job
	log := logf.FromContext(ctx)
	lease, locker, held := r.Watchdog.Holding(g.ref)
	if !held && g.dl != nil && len(g.keys) > 0 && job.Annotations[locksv1alpha1.AnnotationLost] == "" {
		if h, err := r.Registry.For(ctx, g.ref, g.dl); err == nil {
			locker = h.Locker
			fence, _ := strconv.ParseInt(job.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
			lease = &lock.Lease{Keys: g.keys, Owner: g.owner, Holder: g.holder.Encode(), Fence: fence, Limit: int(g.dl.Spec.MaxHolders)}
		}
	}
	if locker != nil {
		r.Watchdog.Drop(g.ref)
		// With spec.cooldownSeconds the lease stays in the store until the
		// cooldown ends (distributedlock_holds.go).
		until, err := releaseOrCool(ctx, locker, lease, cooldownOf(g.dl), r.Clock.Now())
		switch {
		case err == nil:
			if !lease.Acquired.IsZero() {
				metrics.HoldSeconds.WithLabelValues(jobKind).Observe(r.Clock.Since(lease.Acquired).Seconds())
			}
			r.notifyLock(job)
			r.eventf(job, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released lock %s (fencing token %d)%s", job.Labels[locksv1alpha1.LabelLock], lease.Fence, cooldownNote(until))
			if g.dl != nil {
				r.Recorder.Eventf(g.dl, job, corev1.EventTypeNormal, locksv1alpha1.EventReleased, "Release", "Released by Job %s (fencing token %d)%s", job.Name, lease.Fence, cooldownNote(until))
			}
			log.Info("Released lock of Job", "fence", lease.Fence)
		case errors.Is(err, lock.ErrNotHeld):
		default:
			if r.Clock.Now().Before(lease.Expires) {
				return ctrl.Result{}, fmt.Errorf("release lock of Job (it expires with its TTL): %w", err)
			}
		}
		if err := locker.Dequeue(ctx, lease.Keys, g.owner); err != nil {
			log.V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "error", err.Error())
		}
		if err != nil {
			// It held nothing: it waited, and may have been the waiter
			// whose turn it was (woken by a release, then deleted or
			// ended). The next one is woken now. (A backend that
			// announces a waiter leaving the head of its queue wakes it
			// too; the two coalesce when they meet. A release that
			// succeeded is announced by every backend.)
			r.wakeLock(g)
		}
	}
	r.Registry.Forget(g.ref)
	r.forget(types.NamespacedName{Namespace: job.Namespace, Name: job.Name})
	r.waits.stopWaiting(types.NamespacedName{Namespace: job.Namespace, Name: job.Name})
	before := job.DeepCopy()
	changed := controllerutil.RemoveFinalizer(job, locksv1alpha1.Finalizer)
	for _, k := range []string{locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor} {
		if _, ok := job.Annotations[k]; ok {
			delete(job.Annotations, k)
			changed = true
		}
	}
	for k, v := range annotations {
		setAnnotation(&job.ObjectMeta, k, v)
		changed = true
	}
	if changed {
		// Optimistic: the patch replaces the whole finalizer list, so it
		// must not apply to a Job whose other finalizers changed meanwhile.
		if err := r.Client.Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
		}
	}
	return ctrl.Result{}, nil
}
