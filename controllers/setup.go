package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// Deps are what every reconciler of lease holders needs. All fields but
// Clock and Log are required.
type Deps struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Registry builds and shares the lock backends.
	Registry *backend.Registry
	// Watchdog renews the leases the operator holds.
	Watchdog *watchdog.Watchdog
	// Tokens derives owner tokens from holders.
	Tokens *holder.Tokens
	// Recorder records Events on locks, Jobs and CronJobs.
	Recorder events.EventRecorder
	// ClusterName is recorded with every lease (the operator's --cluster-name).
	ClusterName string
	// Clock tells the time (default: the real clock).
	Clock clock.PassiveClock
	// Log is for work done outside a reconcile: store notifications and
	// index lookups (default: controller-runtime's logger).
	Log logr.Logger
}

func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	if d.Log.GetSink() == nil {
		d.Log = ctrl.Log.WithName("controllers")
	}
	return d
}

// LockOptions are the controllers' settings. Where a lock may connect and
// where scope Global is allowed is the Registry's policy (backend.Policy).
type LockOptions struct {
	// MinSafeTTL is the shortest TTL that outlives a failover of the
	// operator's leader; shorter TTLs are warned about (0: no warning).
	MinSafeTTL time.Duration
	// Resync is how often every lock's status is refreshed from the backend
	// (one batched inspection per backend, see statusResync), and how often
	// the leases the watchdog renews are checked against their holders
	// (default DefaultResyncPeriod).
	Resync time.Duration
	// Workers is how many locks, and how many Jobs, are reconciled at once
	// (default DefaultWorkers).
	Workers int
	// SyncCronJobTemplates copies a CronJob's lockwarden.io/lock and
	// lockwarden.io/contention annotations into its job template. Off by
	// default: it needs the right to patch every CronJob, and the admission
	// webhook gates the Jobs of annotated CronJobs without it.
	SyncCronJobTemplates bool
	// NamespaceQPS is each namespace's share of reconciles a second (see
	// namespaceBudget): 0 means DefaultNamespaceQPS, a negative value lifts
	// the bound.
	NamespaceQPS float64
	// KueueAdmissionCheck runs the Kueue admission check controller
	// (WorkloadReconciler); the cluster must serve Kueue's v1beta2 API.
	KueueAdmissionCheck bool
}

// BackendWorkerShare is how many of a controller's workers reconciles of
// one backend may use at once: half, at least one. (A reconcile keeps its
// place while it writes to the API server too, so a busy API server must
// not turn the bound on a healthy backend into a queue of its own.)
func BackendWorkerShare(workers int) int { return max(1, workers/2) }

// DefaultWorkers is how many locks, and how many Jobs, are reconciled at
// once by default: one tenant's slow backend does not hold everyone's.
const DefaultWorkers = 16

// Reconcilers are the controllers SetupWithManager registered.
type Reconcilers struct {
	Locks *DistributedLockReconciler
	Jobs  *JobReconciler
	Pods  *PodReconciler
	// ClusterBackends and Backends report ClusterLockBackends' and
	// LockBackends' use and health.
	ClusterBackends, Backends *BackendStatusReconciler
	// CronJobs is nil unless LockOptions.SyncCronJobTemplates.
	CronJobs *CronJobReconciler
	// Workloads is nil unless LockOptions.KueueAdmissionCheck.
	Workloads *WorkloadReconciler
}

// SetupWithManager wires every lockwarden controller into mgr: the field
// indexes, the DistributedLock, Job, backend-status and CronJob reconcilers, and the
// watchdog's lost-lease callbacks, and the sweep of orphaned leases. It is
// the only place that does; there is no order to keep.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, d Deps, o LockOptions) (*Reconcilers, error) {
	if err := IndexFields(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, fmt.Errorf("register field indexes: %w", err)
	}
	if d.Recorder != nil {
		d.Recorder = liveNamespaceRecorder{EventRecorder: d.Recorder, client: d.Client}
	}
	locks := NewDistributedLockReconciler(d, o)
	jobs := NewJobReconciler(d, locks.Enqueue)
	jobs.workers = locks.Workers
	locks.rollouts = newRolloutMemory()
	pods := NewPodReconciler(d, locks.Enqueue, locks.rollouts)
	pods.workers = locks.Workers
	// A share per namespace in each controller: a Job's changes reconcile
	// its lock too (its status lists the queue), and would use the share
	// of its namespace's Jobs otherwise.
	jobs.budget = newNamespaceBudget(o.NamespaceQPS)
	locks.budget = newNamespaceBudget(o.NamespaceQPS)
	pods.budget = newNamespaceBudget(o.NamespaceQPS)
	// A backend that answers slowly (a tenant's, on purpose or not) holds
	// at most half of each controller's workers; its other reconciles come
	// back later without calling it.
	d.Registry.SetBulkhead(BackendWorkerShare(locks.Workers))
	d.Watchdog.OnLost(locks.onLost)
	d.Watchdog.OnLost(jobs.onLost)
	d.Watchdog.OnLost(pods.onLost)
	if err := locks.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the DistributedLock controller: %w", err)
	}
	if err := jobs.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the Job controller: %w", err)
	}
	if err := pods.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the Pod controller: %w", err)
	}
	if err := mgr.Add(&statusResync{table: locks.resync, enqueue: locks.enqueueWait, interval: locks.Resync, log: locks.Log.WithName("resync")}); err != nil {
		return nil, fmt.Errorf("set up the status resync: %w", err)
	}
	if err := mgr.Add(&orphanSweeper{Deps: locks.Deps, interval: locks.Resync, forgetLock: locks.dropLockState, forgetJob: jobs.dropJobState}); err != nil {
		return nil, fmt.Errorf("set up the orphaned-lease sweep: %w", err)
	}
	out := &Reconcilers{Locks: locks, Jobs: jobs, Pods: pods,
		ClusterBackends: NewClusterLockBackendReconciler(d.Client, d.Registry, locks.Resync),
		Backends:        NewLockBackendReconciler(d.Client, d.Registry, locks.Resync),
	}
	for _, b := range []*BackendStatusReconciler{out.ClusterBackends, out.Backends} {
		if err := b.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up the %s controller: %w", b.kind, err)
		}
	}
	if o.SyncCronJobTemplates {
		out.CronJobs = &CronJobReconciler{Client: d.Client}
		if err := out.CronJobs.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up the CronJob controller: %w", err)
		}
	}
	if o.KueueAdmissionCheck {
		out.Workloads = NewWorkloadReconciler(d, mgr.GetAPIReader())
		if err := out.Workloads.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up the Kueue admission check controller: %w", err)
		}
	}
	return out, nil
}

// liveNamespaceRecorder drops the Events of objects in a namespace that is
// being deleted. The API server refuses to create anything there, and the
// event broadcaster logs each refusal as an error: deleting a namespace
// releases every lock and Job lease in it, and would log one error per
// lock (tens of thousands at the sizes the load harness runs).
type liveNamespaceRecorder struct {
	events.EventRecorder
	client client.Reader
}

// Eventf records the Event unless regarding's namespace is being deleted. The
// namespace is read from the manager's cache (the lock controller watches
// namespaces); when it cannot be read, the Event is recorded.
func (r liveNamespaceRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if o, ok := regarding.(metav1.Object); ok && o.GetNamespace() != "" {
		var ns corev1.Namespace
		if err := r.client.Get(context.Background(), types.NamespacedName{Name: o.GetNamespace()}, &ns); err == nil && !ns.DeletionTimestamp.IsZero() {
			return
		}
	}
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// NewDistributedLockReconciler returns the DistributedLock reconciler.
func NewDistributedLockReconciler(d Deps, o LockOptions) *DistributedLockReconciler {
	d = d.withDefaults()
	if o.Resync == 0 {
		o.Resync = DefaultResyncPeriod
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	return &DistributedLockReconciler{
		Deps:        d,
		LockOptions: o,
		tracker:     newTracker(lockKind, func() client.Object { return &locksv1alpha1.DistributedLock{} }),
		resync:      newResyncTable(),
		warned:      map[warning]int64{},
		holdEnded:   map[types.NamespacedName]endedHold{},
	}
}

// NewJobReconciler returns the gated-Job reconciler; lockChanged (may be
// nil) is told when a Job joins a lock's queue, starts or releases, so that
// the lock's status shows it at once.
func NewJobReconciler(d Deps, lockChanged func(types.NamespacedName)) *JobReconciler {
	return &JobReconciler{
		Deps:        d.withDefaults(),
		lockChanged: lockChanged,
		workers:     DefaultWorkers,
		tracker:     newTracker(jobKind, func() client.Object { return &batchv1.Job{} }),
		podWaits:    &podWaits{},
		wakes:       newWakeQueue(),
		wakeGate:    newWakeGate(),
		shows:       newKeyedLimiter(showRate, showBurst),
	}
}
