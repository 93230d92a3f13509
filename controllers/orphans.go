package controllers

import (
	"context"
	"errors"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
)

// orphanTimeout bounds the release of one orphaned lease.
const orphanTimeout = 10 * time.Second

// orphanSweeper releases the leases the watchdog renews for holders that are
// gone or no longer gated: a Job deleted without its finalizer, a Job whose
// finalizer or lock label was removed, a Job replaced by another of the same
// name, a lock deleted without its finalizer. The reconcilers release such
// leases as soon as they see the change; the sweep is the backstop for
// changes they never see (a missed event, a restart in between). It runs on
// the leader, every resync period.
//
// It also drops what the operator keeps for holders that are gone without
// holding (a lock or Job deleted after its finalizer was removed, while it
// waited or its backend was down): their use of a backend, so that a
// backend nobody uses is closed, and a lock's metric series.
type orphanSweeper struct {
	Deps
	interval time.Duration
	// forgetLock and forgetJob drop what the reconcilers keep for a lock or
	// a Job that is gone.
	forgetLock, forgetJob func(types.NamespacedName)
}

// NeedLeaderElection makes the sweep run where the watchdog runs: on the leader.
func (s *orphanSweeper) NeedLeaderElection() bool { return true }

// Start sweeps every interval until ctx ends.
func (s *orphanSweeper) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, s.sweep, s.interval)
	return nil
}

// sweep checks every lease the watchdog renews against the cache.
func (s *orphanSweeper) sweep(ctx context.Context) {
	for _, ref := range s.Watchdog.Refs() {
		lease, _, ok := s.Watchdog.Holding(ref)
		if !ok {
			continue
		}
		obj, why, err := s.orphaned(ctx, ref, lease)
		if err != nil {
			s.Log.Error(err, "Checking a held lease against its holder failed; trying again at the next sweep", "holder", ref)
			continue
		}
		if why != "" {
			releaseOrphan(ctx, s.Deps, ref, obj, why)
		}
	}
	s.sweepState(ctx)
}

// sweepState drops the backend use and metric series of holders that are
// gone from the cache and hold nothing (the lease sweep handles those that
// hold).
func (s *orphanSweeper) sweepState(ctx context.Context) {
	gone := func(kind string, nn types.NamespacedName) bool {
		if _, _, held := s.Watchdog.Holding(holder.Ref{Kind: kind, Namespace: nn.Namespace, Name: nn.Name}); held {
			return false
		}
		var obj client.Object
		switch kind {
		case jobKind:
			obj = &batchv1.Job{}
		case lockKind:
			obj = &locksv1alpha1.DistributedLock{}
		case podKind:
			obj = &corev1.Pod{}
		default:
			return false // a workload's use ends with its lease (see orphaned)
		}
		return apierrors.IsNotFound(s.Client.Get(ctx, nn, obj))
	}
	forgotten := 0
	for _, ref := range s.Registry.Users() {
		if ref.Kind != jobKind && ref.Kind != lockKind && ref.Kind != podKind {
			continue // a Kueue Workload's or a Pod workload's: forgotten with its lease
		}
		nn := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
		if !gone(ref.Kind, nn) {
			continue
		}
		forgotten++
		switch ref.Kind {
		case jobKind:
			s.forgetJob(nn)
		case lockKind:
			s.forgetLock(nn)
		default:
			s.Registry.Forget(ref)
		}
	}
	for _, nn := range metrics.LockSeries() {
		if gone(lockKind, nn) {
			forgotten++
			s.forgetLock(nn)
		}
	}
	if forgotten > 0 {
		s.Log.V(1).Info("Forgot holders that are gone", "count", forgotten)
	}
}

// orphaned says why the lease held for ref has no holder any more ("" when
// it has one), and returns the holding object when it still exists.
func (s *orphanSweeper) orphaned(ctx context.Context, ref holder.Ref, lease *lock.Lease) (client.Object, string, error) {
	nn := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	switch ref.Kind {
	case jobKind:
		var job batchv1.Job
		if err := s.Client.Get(ctx, nn, &job); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "the Job is gone, or no longer carries the lock label", nil
			}
			return nil, "", err
		}
		return &job, jobOrphaned(&job, lease), nil
	case lockKind:
		var dl locksv1alpha1.DistributedLock
		if err := s.Client.Get(ctx, nn, &dl); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "the DistributedLock is gone", nil
			}
			return nil, "", err
		}
		if string(dl.UID) != holder.Decode(lease.Holder).UID {
			return nil, "the DistributedLock was replaced by another of the same name", nil
		}
		return nil, "", nil
	case podKind:
		var pod corev1.Pod
		if err := s.Client.Get(ctx, nn, &pod); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "the Pod is gone, or no longer carries the lock label", nil
			}
			return nil, "", err
		}
		return &pod, podOrphaned(&pod, lease), nil
	case "Deployment", "StatefulSet", "ReplicaSet":
		why, err := podWorkloadOrphaned(ctx, s.Client, ref, lease)
		return nil, why, err
	case workloadKind:
		return workloadOrphaned(ctx, s.Client, nn, lease)
	}
	return nil, "", nil
}

// podOrphaned says why a Pod no longer holds lease ("" when it does).
func podOrphaned(pod *corev1.Pod, lease *lock.Lease) string {
	switch {
	case pod.Labels[locksv1alpha1.LabelLock] == "":
		return "the Pod no longer carries the lock label"
	case !controllerutil.ContainsFinalizer(pod, locksv1alpha1.Finalizer):
		return "the Pod's finalizer was removed"
	case lease != nil && holder.Decode(lease.Holder).UID != string(pod.UID):
		return "the Pod was replaced by another of the same name"
	}
	return ""
}

// jobOrphaned says why a Job no longer holds lease ("" when it does).
func jobOrphaned(job *batchv1.Job, lease *lock.Lease) string {
	switch {
	case job.Labels[locksv1alpha1.LabelLock] == "":
		return "the Job no longer carries the lock label"
	case !controllerutil.ContainsFinalizer(job, locksv1alpha1.Finalizer):
		return "the Job's finalizer was removed"
	case lease != nil && holder.Decode(lease.Holder).UID != string(job.UID):
		return "the Job was replaced by another of the same name"
	}
	return ""
}

// releaseOrphan stops renewing the lease held for ref and releases it; obj,
// when not nil, is told why with an Event.
func releaseOrphan(ctx context.Context, d Deps, ref holder.Ref, obj client.Object, why string) {
	lease, locker, ok := d.Watchdog.Holding(ref)
	if !ok {
		return
	}
	d.Watchdog.Drop(ref)
	ctx, cancel := context.WithTimeout(ctx, orphanTimeout)
	defer cancel()
	// A workload that vanished released the lock too: with a cooldown its
	// lease cools down (distributedlock_holds.go). A lock that is gone
	// has none.
	var cooldown time.Duration
	if ref.Kind != lockKind {
		var dl locksv1alpha1.DistributedLock
		if h := holder.Decode(lease.Holder); d.Client.Get(ctx, types.NamespacedName{Namespace: h.Namespace, Name: h.Lock}, &dl) == nil {
			cooldown = cooldownOf(&dl)
		}
	}
	_, err := releaseOrCool(ctx, locker, lease, cooldown, d.Clock.Now())
	if err := locker.Dequeue(ctx, lease.Keys, lease.Owner); err != nil {
		d.Log.V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "holder", ref, "error", err.Error())
	}
	d.Registry.Forget(ref)
	metrics.OrphansReleased.WithLabelValues(ref.Kind).Inc()
	switch {
	case err == nil, errors.Is(err, lock.ErrNotHeld):
		d.Log.Info("Released the lease of a holder that is gone or no longer gated", "holder", ref, "fence", lease.Fence, "why", why)
	default:
		// Not renewed any more: it ends with its TTL at the latest.
		d.Log.Error(err, "Releasing an orphaned lease failed; it expires with its TTL", "holder", ref, "fence", lease.Fence, "why", why)
	}
	if obj != nil {
		d.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, locksv1alpha1.EventOrphanReleased, "Release",
			"Released lock %s (fencing token %d): %s", holder.Decode(lease.Holder).Lock, lease.Fence, why)
	}
}
