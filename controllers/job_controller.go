package controllers

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
)

const jobKind = "Job"

// JobReconciler runs gated Jobs one at a time: it acquires the lock for a
// suspended Job (in FIFO order, or not at all with contention Skip), hands it
// the fencing token, unsuspends it, renews the lease while it runs and
// releases it when the Job finishes or is deleted.
type JobReconciler struct {
	Deps

	// lockChanged, when set, is told when a Job joins a lock's queue, starts
	// or releases, so that the lock's status shows it at once.
	lockChanged func(types.NamespacedName)

	// workers is how many Jobs are reconciled at once.
	workers int

	// tracker carries reconcile requests from the backend (releases) and the
	// watchdog (lost leases), and remembers waiting Jobs.
	*tracker
}

// The Job controller patches gated Jobs (fencing token, suspend, finalizer)
// and deletes the Jobs of CronJobs whose contention is Skip; it reads
// CronJobs to name them in Events.
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile moves one gated Job through waiting, holding and releasing.
func (r *JobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var job batchv1.Job
	if err := r.Client.Get(ctx, req.NamespacedName, &job); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone, or no longer labelled (the cache holds only gated Jobs):
			// a lease still renewed for it has no holder.
			ref := holder.Ref{Kind: jobKind, Namespace: req.Namespace, Name: req.Name}
			releaseOrphan(ctx, r.Deps, ref, nil, "the Job is gone, or no longer carries the lock label")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if lease, _, held := r.Watchdog.Holding(jobRef(&job)); held {
		if why := jobOrphaned(&job, lease); why != "" {
			releaseOrphan(ctx, r.Deps, jobRef(&job), &job, why)
		}
	}
	if job.Labels[locksv1alpha1.LabelLock] == "" || !controllerutil.ContainsFinalizer(&job, locksv1alpha1.Finalizer) {
		return ctrl.Result{}, nil // not gated, or done with
	}
	g, err := r.gatedJob(ctx, &job)
	if err != nil {
		return ctrl.Result{}, err
	}
	switch phaseOf(&job) {
	case phaseDone:
		return r.reconcileRelease(ctx, g)
	case phaseLostReported:
		return ctrl.Result{}, nil // the Job runs on (Ignore) or was stopped (Terminate)
	case phaseHolding:
		return r.reconcileHeld(ctx, g)
	default:
		return r.reconcileWaiting(ctx, g)
	}
}

// jobPhase is where a gated Job is in its life with the lock.
type jobPhase string

const (
	// phaseWaiting: suspended until it acquires the lock.
	phaseWaiting jobPhase = "Waiting"
	// phaseHolding: started with a fencing token; its lease is renewed.
	phaseHolding jobPhase = "Holding"
	// phaseLostReported: its lease was lost and that was recorded on it.
	phaseLostReported jobPhase = "LostReported"
	// phaseDone: finished or being deleted; its lease is released.
	phaseDone jobPhase = "Done"
)

// phaseOf decides a gated Job's phase from the Job alone.
func phaseOf(job *batchv1.Job) jobPhase {
	switch {
	case !job.DeletionTimestamp.IsZero() || jobFinished(job):
		return phaseDone
	case job.Annotations[locksv1alpha1.AnnotationLost] != "":
		return phaseLostReported
	case job.Annotations[locksv1alpha1.AnnotationFencingToken] != "":
		return phaseHolding
	default:
		return phaseWaiting
	}
}

// gatedJob is a Job with what its reconcile needs to know about its lock.
type gatedJob struct {
	job *batchv1.Job
	// dl is the Job's lock; nil when it was deleted.
	dl     *locksv1alpha1.DistributedLock
	ref    holder.Ref
	holder holder.Holder
	owner  string
}

func (r *JobReconciler) gatedJob(ctx context.Context, job *batchv1.Job) (*gatedJob, error) {
	lockName := job.Labels[locksv1alpha1.LabelLock]
	g := &gatedJob{job: job, ref: jobRef(job)}
	g.holder = holder.Holder{
		Cluster: r.ClusterName, Namespace: job.Namespace, Lock: lockName, Kind: jobKind, Name: job.Name, UID: string(job.UID),
		Identity: holder.WorkloadIdentity(r.ClusterName, job.Namespace, jobKind, job.Name, string(job.UID)),
	}
	g.owner = r.Tokens.Owner(g.holder)
	var dl locksv1alpha1.DistributedLock
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: lockName}, &dl); err == nil {
		g.dl = &dl
	} else if client.IgnoreNotFound(err) != nil {
		return nil, err
	}
	return g, nil
}

func jobFinished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func jobRef(job *batchv1.Job) holder.Ref {
	return holder.Ref{Kind: jobKind, Namespace: job.Namespace, Name: job.Name}
}

// onRelease wakes the waiting Jobs of every lock on the released key.
func (r *JobReconciler) onRelease(backendID, key string) {
	r.wakeWaiting(indexBackendKey, backendKeyValues(backendID, key)[0])
}

// onHealth wakes the waiting Jobs of every lock on a backend that started
// (or stopped) answering: a Job on a new backend starts at its first answer.
func (r *JobReconciler) onHealth(backendID string, err error) {
	if err == nil {
		r.wakeWaiting(indexBackend, backendID)
	}
}

// wakeWaiting enqueues the waiting Jobs of the locks the index maps value to.
func (r *JobReconciler) wakeWaiting(index, value string) {
	ctx := context.Background()
	var locks locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &locks, client.MatchingFields{index: value}); err != nil {
		r.Log.Error(err, "Listing the locks of a backend event failed; their waiting Jobs try again at their next requeue", "index", index)
		return
	}
	for _, dl := range locks.Items {
		var jobs batchv1.JobList
		if err := r.Client.List(ctx, &jobs, client.InNamespace(dl.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: dl.Name}); err != nil {
			r.Log.Error(err, "Listing the Jobs of a lock failed; they try again at their next requeue", "lock", klog.KObj(&dl))
			continue
		}
		for i := range jobs.Items {
			j := &jobs.Items[i]
			if j.Annotations[locksv1alpha1.AnnotationFencingToken] == "" && !jobFinished(j) {
				r.enqueue(client.ObjectKeyFromObject(j))
			}
		}
	}
}

// SetupWithManager registers the reconciler (use the package's SetupWithManager,
// which also registers the field indexes it looks locks up by).
func (r *JobReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Registry.OnRelease(r.onRelease)
	r.Registry.OnHealth(r.onHealth)
	return ctrl.NewControllerManagedBy(mgr).
		For(&batchv1.Job{}).
		WatchesRawSource(r.source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.workers}).
		Named("job").
		Complete(r)
}

func (r *JobReconciler) notifyLock(job *batchv1.Job) {
	if r.lockChanged != nil {
		r.lockChanged(types.NamespacedName{Namespace: job.Namespace, Name: job.Labels[locksv1alpha1.LabelLock]})
	}
}

func (r *JobReconciler) eventf(obj client.Object, eventtype, reason, action, note string, args ...any) {
	r.Recorder.Eventf(obj, nil, eventtype, reason, action, note, args...)
}

// cronJobOf returns a reference object for the Job's controlling CronJob, for events.
func cronJobOf(job *batchv1.Job) *batchv1.CronJob {
	for _, ref := range job.OwnerReferences {
		if ref.Kind == "CronJob" && ref.Controller != nil && *ref.Controller {
			cj := &batchv1.CronJob{}
			cj.Namespace, cj.Name, cj.UID = job.Namespace, ref.Name, ref.UID
			return cj
		}
	}
	return nil
}

func describeHolder(identity string, fence int64) string {
	if identity == "" {
		return "another waiter ahead in the queue"
	}
	return fmt.Sprintf("%s (fencing token %d)", identity, fence)
}
