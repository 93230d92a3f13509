package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/printable"
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

	// waits remembers the queue positions reported and the Jobs ended
	// without running (set by SetupWithManager; nil remembers nothing).
	waits *waitMemory

	// pods lists the pods of Jobs being released, from the API server (set
	// by SetupWithManager: the manager's uncached reader).
	pods client.Reader
	// podWaits remembers the releases that wait for pods to stop.
	podWaits *podWaits

	// wakes are the keys whose waiting Jobs may have a turn (see wakeTurn),
	// worked through by a wakeRunner.
	wakes workqueue.TypedDelayingInterface[wakeKey]
	// wakeGate bounds the wake-ups of one backend (see wakeGate).
	wakeGate *wakeGate
	// shows bounds, per namespace, the writes that show waiting Jobs their
	// place in the queue (see showRate); nil bounds nothing.
	shows *keyedLimiter
	// budget bounds, per namespace, the reconciles of Jobs that hold no
	// lease (see namespaceBudget); nil bounds nothing.
	budget *namespaceBudget

	// waitRequeue is how soon a waiting Job tries again, keeping its place
	// in the queue (0: waitingRequeue). Tests lengthen it to measure a
	// handover without the periodic attempts in the way; it must stay well
	// below the backends' waiter TTL.
	waitRequeue time.Duration
}

// requeueWaiting is how soon a waiting Job tries again.
func (r *JobReconciler) requeueWaiting() time.Duration {
	if r.waitRequeue > 0 {
		return r.waitRequeue
	}
	return waitingRequeue
}

// The Job controller patches gated Jobs (fencing token, suspend, finalizer,
// queue position), marks the status of Jobs that end without running
// (FailureTarget), and deletes the Jobs of CronJobs whose contention is Skip;
// it reads CronJobs to name them in Events.
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=batch,resources=jobs/status,verbs=patch
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
			r.dropJobState(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	lease, _, held := r.Watchdog.Holding(jobRef(&job))
	if held {
		if why := jobOrphaned(&job, lease); why != "" {
			releaseOrphan(ctx, r.Deps, jobRef(&job), &job, why)
		}
	}
	if job.Labels[locksv1alpha1.LabelLock] == "" || !controllerutil.ContainsFinalizer(&job, locksv1alpha1.Finalizer) {
		return ctrl.Result{}, nil // not gated, or done with
	}
	// A Job that acquired carries its fencing token (only lockwarden writes
	// it): its reconciles stop it when its lease is lost, and release it
	// when it ends, and are never put back.
	if !held && job.Annotations[locksv1alpha1.AnnotationFencingToken] == "" && job.DeletionTimestamp.IsZero() {
		if res, ok := withinBudget(ctx, r.budget, jobKind, req.NamespacedName, r.Clock.Now()); !ok {
			return res, nil
		}
	}
	g, err := r.gatedJob(ctx, &job)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer g.leaveBackend()
	phase := phaseOf(&job)
	if r.waits.hasEnded(&job) {
		phase = phaseDone // ended without running; the cache may not show it yet
	}
	switch phase {
	case phaseDone:
		if res, holding, err := r.holdWhilePodsRun(ctx, g); holding || err != nil {
			return res, err
		}
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
	// phaseDone: finished, ended without running (Skipped, WaitTimedOut,
	// Superseded, Replaced), cancelled or being deleted; its lease is
	// released once its pods stopped.
	phaseDone jobPhase = "Done"
)

// phaseOf decides a gated Job's phase from the Job alone.
func phaseOf(job *batchv1.Job) jobPhase {
	switch {
	case !job.DeletionTimestamp.IsZero() || jobFinished(job) || endedWithoutRunning(job) || jobCancelled(job):
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
	// keys are the store-side keys the Job acquires (its lock's, or the
	// one derived at its admission); keysErr says why it has none.
	keys    []string
	keysErr error
	// leaves give back the backend slots the reconcile took (backendFor).
	leaves []func()
}

// leaveBackend gives back the backend slots the reconcile took.
func (g *gatedJob) leaveBackend() {
	for _, leave := range g.leaves {
		leave()
	}
	g.leaves = nil
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
		g.keys, g.keysErr = backend.WorkloadKeys(g.dl, job.Annotations)
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

// endedWithoutRunning tells whether lockwarden ended the Job while it
// waited: its FailureTarget condition (which kube-controller-manager's Job
// controller turns into Failed) has one of lockwarden's reasons. A
// FailureTarget with another reason (a running Job's pod failure policy)
// is not the end: its pods may still run.
func endedWithoutRunning(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailureTarget && c.Status == corev1.ConditionTrue {
			switch c.Reason {
			case locksv1alpha1.JobReasonSkipped, locksv1alpha1.JobReasonWaitTimedOut, locksv1alpha1.JobReasonSuperseded, locksv1alpha1.JobReasonReplaced:
				return true
			}
		}
	}
	return false
}

func jobRef(job *batchv1.Job) holder.Ref {
	return holder.Ref{Kind: jobKind, Namespace: job.Namespace, Name: job.Name}
}

// onRelease wakes the waiting Jobs whose turn it is on the released key
// (see wakeTurn): the backend's release notifications come one at a time,
// so the work is queued and coalesced rather than done here.
func (r *JobReconciler) onRelease(backendID, key string) {
	r.wakeKeys(backendID, key)
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
		r.enqueueWaiting(jobs.Items)
	}
}

// enqueueWaiting enqueues the Jobs that wait for their lock.
func (r *JobReconciler) enqueueWaiting(jobs []batchv1.Job) {
	for i := range jobs {
		j := &jobs[i]
		if phaseOf(j) == phaseWaiting {
			r.waits.clearPlace(client.ObjectKeyFromObject(j))
			r.enqueue(client.ObjectKeyFromObject(j))
		}
	}
}

// SetupWithManager registers the reconciler (use the package's SetupWithManager,
// which also registers the field indexes it looks locks up by).
func (r *JobReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.waits == nil {
		r.waits = newWaitMemory()
	}
	if r.pods == nil {
		r.pods = mgr.GetAPIReader()
	}
	if err := mgr.Add(wakeRunner{r: r}); err != nil {
		return err
	}
	r.Registry.OnRelease(r.onRelease)
	r.Registry.OnHealth(r.onHealth)
	return ctrl.NewControllerManagedBy(mgr).
		For(&batchv1.Job{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			return !r.ownWaitWrite(e.ObjectOld, e.ObjectNew)
		}})).
		WatchesRawSource(r.source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.workers}).
		Named("job").
		Complete(r)
}

// ownWaitWrite tells whether an update of a Job is only the echo of the
// operator's own write of its waiting annotations (queue position, waiting
// for): nothing else changed, and they are what was last written. Its
// reconcile would have nothing to do but try the store again, once for
// each Job whose place was shown (at every handover, and after each
// periodic attempt that found the place changed).
func (r *JobReconciler) ownWaitWrite(oldObj, newObj client.Object) bool {
	o, ok1 := oldObj.(*batchv1.Job)
	n, ok2 := newObj.(*batchv1.Job)
	if !ok1 || !ok2 {
		return false
	}
	shown := func(j *batchv1.Job) waitShown {
		return waitShown{j.Annotations[locksv1alpha1.AnnotationQueuePosition], j.Annotations[locksv1alpha1.AnnotationWaitingFor]}
	}
	if shown(o) == shown(n) || !r.waits.writes(client.ObjectKeyFromObject(n), shown(n)) {
		return false
	}
	strip := func(j *batchv1.Job) *batchv1.Job {
		c := j.DeepCopy()
		c.ResourceVersion, c.ManagedFields = "", nil
		delete(c.Annotations, locksv1alpha1.AnnotationQueuePosition)
		delete(c.Annotations, locksv1alpha1.AnnotationWaitingFor)
		if len(c.Annotations) == 0 {
			c.Annotations = nil
		}
		return c
	}
	return equality.Semantic.DeepEqual(strip(o), strip(n))
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
	// The identity comes from the backend: shown escaped and bounded.
	return fmt.Sprintf("%s (fencing token %d)", printable.Bounded(identity, holder.MaxShownIdentity), fence)
}

// waitMemory is what the Job reconciler remembers about waiting Jobs between
// reconciles: the queue position each last reported, so that the Waiting
// Event is recorded when the position changes rather than at every requeue;
// the waiting annotations last written on each, so that a change by someone
// else is told apart from the cache lagging behind; and the Jobs it ended
// without running, so that a reconcile that reads such a Job from a cache
// that lags behind never acquires for it. A nil *waitMemory remembers nothing.
type waitMemory struct {
	mu        sync.Mutex
	positions map[types.NamespacedName]string
	shown     map[types.NamespacedName][2]waitShown
	ended     map[types.NamespacedName]types.UID
	// writing is the waiting annotations last being written on each Job,
	// recorded before the write so that its echo (the update of the Job it
	// causes) is told from any other change (see ownWaitWrite).
	writing map[types.NamespacedName]waitShown
	// tried is when each waiting Job last tried the store and was queued.
	tried map[types.NamespacedName]time.Time
	// places are the queue places read from the store for waiting Jobs
	// (see wakeTurn), each shown by the Job's next reconcile instead of a
	// call to the store.
	places map[types.NamespacedName]queuePlace
}

// queuePlace is a waiting Job's place in the queue as an Inspect of the
// key showed it at, in the terms TryAcquire reports it in.
type queuePlace struct {
	busy *lock.HeldError
	at   time.Time
}

// waitShown are the queue-position and waiting-for annotations written on a Job.
type waitShown struct{ position, waitingFor string }

func newWaitMemory() *waitMemory {
	return &waitMemory{
		positions: map[types.NamespacedName]string{},
		writing:   map[types.NamespacedName]waitShown{},
		tried:     map[types.NamespacedName]time.Time{},
		places:    map[types.NamespacedName]queuePlace{},
		shown:     map[types.NamespacedName][2]waitShown{},
		ended:     map[types.NamespacedName]types.UID{},
	}
}

// wroteShown remembers the waiting annotations written on nn, and the ones
// written before them (none, at first).
func (m *waitMemory) wroteShown(nn types.NamespacedName, s waitShown) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shown[nn] = [2]waitShown{m.shown[nn][1], s}
}

// tampered tells whether the waiting annotations seen on nn are none of
// what the operator writes now, wrote last, or wrote before (a cache that
// lags behind the last write shows that): someone else changed them,
// or removed them. After a restart of the operator nothing counts: it
// remembers no writes.
func (m *waitMemory) tampered(nn types.NamespacedName, seen, want waitShown) bool {
	if m == nil || seen == want {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	wrote, ok := m.shown[nn]
	return ok && seen != wrote[0] && seen != wrote[1]
}

// positionDiffers reports whether position is not the one last reported
// for nn, without remembering it.
func (m *waitMemory) positionDiffers(nn types.NamespacedName, position string) bool {
	if m == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, ok := m.positions[nn]
	return !ok || prev != position
}

// positionChanged records position as nn's and reports whether it differs
// from the one recorded before.
func (m *waitMemory) positionChanged(nn types.NamespacedName, position string) bool {
	if m == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev, ok := m.positions[nn]; ok && prev == position {
		return false
	}
	m.positions[nn] = position
	return true
}

// markEnded remembers that the Job ended without running.
func (m *waitMemory) markEnded(job *batchv1.Job) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	nn := client.ObjectKeyFromObject(job)
	delete(m.positions, nn)
	delete(m.shown, nn)
	m.dropWaiting(nn)
	m.ended[nn] = job.UID
}

// hasEnded tells whether this Job (this UID) was ended without running.
func (m *waitMemory) hasEnded(job *batchv1.Job) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	uid, ok := m.ended[client.ObjectKeyFromObject(job)]
	return ok && uid == job.UID
}

// stopWaiting forgets nn's position (it acquired, or is done).
func (m *waitMemory) stopWaiting(nn types.NamespacedName) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.positions, nn)
	delete(m.shown, nn)
	m.dropWaiting(nn)
}

// forget drops everything remembered about nn (the Job is gone).
func (m *waitMemory) forget(nn types.NamespacedName) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.positions, nn)
	delete(m.shown, nn)
	m.dropWaiting(nn)
	delete(m.ended, nn)
}

// dropWaiting forgets what is remembered of nn while it waits (m.mu held).
func (m *waitMemory) dropWaiting(nn types.NamespacedName) {
	delete(m.writing, nn)
	delete(m.tried, nn)
	delete(m.places, nn)
}

// willWrite records the waiting annotations about to be written on nn.
func (m *waitMemory) willWrite(nn types.NamespacedName, s waitShown) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writing[nn] = s
}

// writes tells whether s are the waiting annotations last written on nn.
func (m *waitMemory) writes(nn types.NamespacedName, s waitShown) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.writing[nn]
	return ok && w == s
}

// triedAt records that nn tried the store at t and was queued.
func (m *waitMemory) triedAt(nn types.NamespacedName, t time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tried[nn] = t
}

// placeMaxAge bounds how old a place read from the store may be when the
// Job's reconcile shows it.
const placeMaxAge = 2 * time.Second

// setPlace records nn's place in the queue, read from the store at at.
func (m *waitMemory) setPlace(nn types.NamespacedName, busy *lock.HeldError, at time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.places[nn] = queuePlace{busy: busy, at: at}
}

// clearPlace forgets the place recorded for nn: its next reconcile tries the store.
func (m *waitMemory) clearPlace(nn types.NamespacedName) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.places, nn)
}

// takePlace returns (and forgets) the place recorded for nn, if the
// reconcile at now may show it instead of trying the store: it is fresh
// (younger than placeMaxAge, and read after nn last tried), and the
// attempt that keeps nn's place in the queue (requeue after the last) is
// not due yet. It also returns when that attempt is due: the wake-up
// replaced the requeue that was waiting for it, and the reconcile asks
// for it again.
func (m *waitMemory) takePlace(nn types.NamespacedName, now time.Time, requeue time.Duration) (*lock.HeldError, time.Time, bool) {
	if m == nil {
		return nil, time.Time{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.places[nn]
	delete(m.places, nn)
	tried, wasTried := m.tried[nn]
	if !ok || !wasTried || now.Sub(p.at) > placeMaxAge || p.at.Before(tried) || now.Sub(tried) >= requeue {
		return nil, time.Time{}, false
	}
	return p.busy, tried.Add(requeue), true
}

// dropJobState forgets everything the operator keeps for the gated Job nn
// beyond its lease: its use of a backend (closed when nobody else uses it)
// and what the tracker and the wait memories remember of it. A reconcile
// that finds the Job gone (or no longer gated) calls it; so does the sweep.
func (r *JobReconciler) dropJobState(nn types.NamespacedName) {
	r.Registry.Forget(holder.Ref{Kind: jobKind, Namespace: nn.Namespace, Name: nn.Name})
	r.forget(nn)
	r.waits.forget(nn)
	r.podWaits.forget(nn)
	r.budget.forget(nn)
}
