// Package metrics defines lockwarden's Prometheus metrics, served on the
// manager's metrics endpoint next to controller-runtime's own.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Label values of result labels.
const (
	ResultAcquired = "acquired"
	ResultBusy     = "busy"
	ResultError    = "error"
	ResultOK       = "ok"
	ResultLost     = "lost"
	// ResultPreempted: a renewal refused because a newer request with
	// contention CancelInProgress stopped the lease.
	ResultPreempted = "preempted"
)

var (
	// Acquisitions counts acquisition attempts by kind of holder and result
	// (acquired, busy, error).
	Acquisitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_acquisitions_total",
		Help: "Acquisition attempts, by holder kind and result (acquired, busy, error).",
	}, []string{"kind", "result"})

	// WaitSeconds observes how long holders waited between asking and holding.
	WaitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockwarden_wait_seconds",
		Help:    "Time from a holder's first attempt to its acquisition.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
	}, []string{"kind"})

	// HoldSeconds observes how long leases were held, from acquisition to release or loss.
	HoldSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockwarden_hold_seconds",
		Help:    "Time from acquisition to release or loss of a lease.",
		Buckets: prometheus.ExponentialBuckets(0.1, 4, 12),
	}, []string{"kind"})

	// Renewals counts lease renewals by result (ok, lost, error).
	Renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_renewals_total",
		Help: "Lease renewals by result (ok, lost, preempted: stopped by a newer Job with contention CancelInProgress, error: the backend did not answer and the renewal will be retried).",
	}, []string{"result"})

	// ShowsDeferred counts queue-position updates of waiting Jobs deferred
	// because their namespace used its share of these writes.
	ShowsDeferred = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_queue_position_writes_deferred_total",
		Help: "Queue-position updates of waiting Jobs deferred to their next attempt because their namespace used its share of these API writes.",
	})

	// ReconcilesDeferred counts reconciles put back because their
	// namespace used its share of the controllers' work.
	ReconcilesDeferred = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_namespace_reconciles_deferred_total",
		Help: "Reconciles of locks and gated Jobs put back for later because their namespace used its share of the controllers' work (and of the API writes that come with it).",
	}, []string{"controller"})

	// RenewalBatches counts renewal round trips (one per backend per batch).
	RenewalBatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_renewal_batches_total",
		Help: "Batched renewal calls: each renews every due lease of one backend in one round trip per node.",
	})

	// StatusResyncBatches counts the status resync's batched inspections
	// (one per backend per resync period, one round trip per node each).
	StatusResyncBatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_status_resync_batches_total",
		Help: "Batched inspections of the status resync: each reads the keys of every lock of one backend in one round trip per node.",
	})
	// StatusResyncLocks counts the locks the status resync inspected.
	StatusResyncLocks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_status_resync_locks_total",
		Help: "Locks whose keys the status resync inspected.",
	})
	// StatusResyncChanged counts the locks the status resync found changed
	// (or could not inspect in two resyncs in a row) and reconciled.
	StatusResyncChanged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_status_resync_changed_total",
		Help: "Locks the status resync found changed in their backend since their status was written (or could not inspect in two resyncs in a row), and reconciled.",
	})

	// OrphansReleased counts leases released because their holder was gone
	// or no longer gated (Job or lock deleted, finalizer or label removed).
	OrphansReleased = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_orphaned_leases_released_total",
		Help: "Leases released because their holder was gone or no longer gated (deleted without its finalizer, finalizer or lock label removed).",
	}, []string{"kind"})
	// LeasesLost counts leases lost (expired or taken) while held.
	LeasesLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_leases_lost_total",
		Help: "Leases lost while held: expired during a backend outage, or taken over.",
	}, []string{"kind"})

	// ForceReleases counts leases taken away on request (lockwarden.io/force-release).
	ForceReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_force_releases_total",
		Help: "Leases taken away from their holder on request (lockwarden.io/force-release), by holder kind.",
	}, []string{"kind"})

	// LeasesHeld is the number of leases the operator holds and renews now.
	LeasesHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockwarden_leases_held",
		Help: "Leases the operator holds and renews now.",
	})

	// QueueDepth is the exact length of each lock's FIFO queue, as last observed.
	QueueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockwarden_queue_depth",
		Help: "Waiters in a DistributedLock's FIFO queue (its first key; the exact count, not only those listed in status), as last observed.",
	}, []string{"namespace", "lock"})

	// OldestWaiter is when the oldest waiter of each lock's FIFO queue
	// joined it, as last observed; 0 when the queue is empty.
	OldestWaiter = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockwarden_queue_oldest_waiter_timestamp_seconds",
		Help: "Unix time at which the oldest waiter in a DistributedLock's FIFO queue (its first key) joined it, on the backend's clock, as last observed; 0 when the queue is empty. time() minus it is how long that waiter has waited.",
	}, []string{"namespace", "lock"})

	// LockHolders is how many holders hold each lock's keys, as last observed.
	LockHolders = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockwarden_lock_holders",
		Help: "Holders of a DistributedLock's first key (up to its spec.maxHolders), as last observed.",
	}, []string{"namespace", "lock"})

	// BackendUp is 1 while a lock's backend answers, 0 when it does not.
	BackendUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockwarden_backend_up",
		Help: "1 while a DistributedLock's backend answers, 0 when it does not.",
	}, []string{"namespace", "lock"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(Acquisitions, WaitSeconds, HoldSeconds, Renewals, RenewalBatches, ShowsDeferred, ReconcilesDeferred,
		StatusResyncBatches, StatusResyncLocks, StatusResyncChanged, LeasesLost, OrphansReleased, ForceReleases, LeasesHeld, QueueDepth, OldestWaiter, LockHolders, BackendUp)
}

// lockSeries are the series kept per DistributedLock.
var lockSeries = []*prometheus.GaugeVec{QueueDepth, OldestWaiter, LockHolders, BackendUp}

// LockSeries returns the locks (namespace, name) that have a per-lock
// series, so that a sweep can drop those of locks that are gone.
func LockSeries() []types.NamespacedName {
	seen := map[types.NamespacedName]struct{}{}
	for _, v := range lockSeries {
		ch := make(chan prometheus.Metric, 64)
		go func() {
			v.Collect(ch)
			close(ch)
		}()
		for m := range ch {
			var pb dto.Metric
			if m.Write(&pb) != nil {
				continue
			}
			var nn types.NamespacedName
			for _, l := range pb.GetLabel() {
				switch l.GetName() {
				case "namespace":
					nn.Namespace = l.GetValue()
				case "lock":
					nn.Name = l.GetValue()
				}
			}
			seen[nn] = struct{}{}
		}
	}
	out := make([]types.NamespacedName, 0, len(seen))
	for nn := range seen {
		out = append(out, nn)
	}
	return out
}

// DeleteLock drops every per-lock series of the lock.
func DeleteLock(nn types.NamespacedName) {
	for _, v := range lockSeries {
		v.DeleteLabelValues(nn.Namespace, nn.Name)
	}
}
