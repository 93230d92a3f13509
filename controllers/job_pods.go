package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A Job that held its lock keeps it until its pods have stopped. Deleting a
// Job does not stop its pods at once: with the default (background)
// propagation they are deleted after the Job is gone and run through their
// termination grace period; with propagation Orphan they run on, owned by
// nobody. A CronJob with concurrencyPolicy Replace deletes its running Job
// the same way. Releasing when the Job is deleted would start the next Job
// beside the old one's pods.
//
// The pods are listed, not watched: only Jobs being released are looked at,
// and the operator needs no cache of every pod in the cluster. The list asks
// the API server for the metadata of at most runningPodsShown+1 pods that
// have not ended (a field selector on status.phase), so what a tenant puts
// in its pods' specs and statuses, or how many pods a Job has, never reaches
// the operator.
// +kubebuilder:rbac:groups="",resources=pods,verbs=list

// runningPodsShown is how many running pods an Event names; a Job with more
// is said to have more.
const runningPodsShown = 5

// runningPodsSelector selects the pods that may still run.
var runningPodsSelector = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)

// Pod listing while a released Job's pods run: soon at first (a pod usually
// stops within its grace period), then less often for pods that run on.
const (
	podPollMin = time.Second
	podPollMax = 30 * time.Second
)

// podWaits remembers, per Job, since when its release waits for its pods and
// which pods the last Event named. A nil *podWaits remembers nothing.
type podWaits struct {
	mu    sync.Mutex
	waits map[types.NamespacedName]podWait
}

type podWait struct {
	uid   types.UID
	since time.Time
	shown string
}

// note records that job waits for the pods named by shown; it returns since
// when it waits and whether shown differs from what was last recorded.
func (p *podWaits) note(job *batchv1.Job, now time.Time, shown string) (time.Time, bool) {
	if p == nil {
		return now, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waits == nil {
		p.waits = map[types.NamespacedName]podWait{}
	}
	nn := client.ObjectKeyFromObject(job)
	w, ok := p.waits[nn]
	if !ok || w.uid != job.UID {
		w = podWait{uid: job.UID, since: now}
	}
	changed := w.shown != shown
	w.shown = shown
	p.waits[nn] = w
	return w.since, changed
}

func (p *podWaits) forget(nn types.NamespacedName) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.waits, nn)
}

// holdWhilePodsRun keeps the lease of a deleted or finished Job that started
// with the lock while any of its pods may still run, and tells whether it
// does (the caller then does not release). A Job being deleted (not with
// propagation Orphan) gets a FailureTarget condition (reason
// JobReasonDeleted), so that the Job controller stops its pods now rather
// than the garbage collector after the Job is gone, which the Job's
// finalizer would hold off for good; orphaned pods are left to run, and the
// lock is held until they end or are deleted.
func (r *JobReconciler) holdWhilePodsRun(ctx context.Context, g *gatedJob) (ctrl.Result, bool, error) {
	job := g.job
	nn := client.ObjectKeyFromObject(job)
	if job.Annotations[locksv1alpha1.AnnotationFencingToken] == "" || job.Annotations[locksv1alpha1.AnnotationLost] != "" ||
		endedWithoutRunning(job) || r.waits.hasEnded(job) {
		return ctrl.Result{}, false, nil // never ran with the lock, or no longer holds it
	}
	lockName := job.Labels[locksv1alpha1.LabelLock]
	pods := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}}
	if err := r.pods.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.ControllerUidLabel: string(job.UID)},
		client.MatchingFieldsSelector{Selector: runningPodsSelector}, client.Limit(runningPodsShown+1)); err != nil {
		r.eventf(job, corev1.EventTypeWarning, locksv1alpha1.EventReleaseWaitsForPods, "Release",
			"Lock %s stays held: cannot list the Job's pods to see whether they stopped: %v", lockName, err)
		return ctrl.Result{}, true, fmt.Errorf("list the pods of the Job: %w", err)
	}
	if len(pods.Items) == 0 {
		r.podWaits.forget(nn)
		return ctrl.Result{}, false, nil
	}
	running := make([]string, 0, len(pods.Items))
	for i := range pods.Items {
		running = append(running, pods.Items[i].Name)
	}
	sort.Strings(running)

	// The lease must stay renewed; after a restart of the operator the
	// watchdog does not hold it yet.
	res := ctrl.Result{}
	if _, _, held := r.Watchdog.Holding(g.ref); !held && !jobCancelled(job) {
		// (A cancelled Job's lease is no longer renewed: it holds the key
		// until its pods stop or it expires.)
		var err error
		if res, err = r.reconcileHeld(ctx, g); err != nil || job.Annotations[locksv1alpha1.AnnotationLost] != "" {
			return res, true, err // lost: the next reconcile releases what is left
		}
	}
	if !job.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(job, metav1.FinalizerOrphanDependents) && !jobEnding(job) {
		// The Job controller leaves the pods of a deleted Job alone (the
		// garbage collector deletes them once the Job is gone), but stops
		// those of a Job that fails.
		before := job.DeepCopy()
		now := metav1.NewTime(r.Clock.Now())
		job.Status.Conditions = append(job.Status.Conditions, batchv1.JobCondition{
			Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonDeleted,
			Message:       fmt.Sprintf("The Job was deleted while it held lock %s; its pods are stopped, then the lock is released", lockName),
			LastProbeTime: now, LastTransitionTime: now,
		})
		if err := r.Client.Status().Patch(ctx, job, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, true, fmt.Errorf("mark the deleted Job failed to stop its pods: %w", err)
		}
	}
	shown := strings.Join(running, ", ")
	if len(running) > runningPodsShown || pods.Continue != "" {
		shown = strings.Join(running[:min(len(running), runningPodsShown)], ", ") + " and more"
	}
	since, changed := r.podWaits.note(job, r.Clock.Now(), shown)
	if changed {
		how := "finished"
		if !job.DeletionTimestamp.IsZero() {
			how = "deleted"
		}
		r.eventf(job, corev1.EventTypeNormal, locksv1alpha1.EventReleaseWaitsForPods, "Release",
			"The Job was %s; lock %s (fencing token %s) stays held until its pods stop: %s",
			how, lockName, job.Annotations[locksv1alpha1.AnnotationFencingToken], shown)
		logf.FromContext(ctx).Info("Release of the Job's lock waits for its pods", "pods", shown)
	}
	wait := min(max(r.Clock.Since(since)/10, podPollMin), podPollMax)
	if res.RequeueAfter == 0 || wait < res.RequeueAfter {
		res.RequeueAfter = wait
	}
	return res, true, nil
}

// jobEnding tells whether the Job finished or the Job controller is ending
// it (a FailureTarget or SuccessCriteriaMet condition): it stops the pods
// itself.
func jobEnding(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobFailed, batchv1.JobFailureTarget, batchv1.JobSuccessCriteriaMet:
			if c.Status == corev1.ConditionTrue {
				return true
			}
		}
	}
	return false
}
