package controllers

import (
	"context"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// Waking waiting Jobs when a key frees up.
//
// Every waiting Job's reconcile calls the store (TryAcquire with Queue: a
// quorum write on ZooKeeper and etcd), and the store's FIFO queue already
// decides who is next. So a release does not wake every waiting Job of every
// lock on the key: it reads the key's state once (Inspect) and wakes only
// the Jobs at the head of the queue that the free slots go to. The others
// keep their place with their periodic requeue (waitingRequeue).
//
// When a Job takes a slot or a waiter leaves the queue, the others move up.
// They are not woken to try the store either: the same one Inspect gives
// the places of the waiters it lists (the head of the queue, at most
// lock.MaxInspectWaiters), and their reconciles show them without a call of
// their own (waitMemory.takePlace); the echo of that write (an update of
// the Job) reconciles nothing (ownWaitWrite). The places of the waiters
// further back catch up at their periodic requeue.
//
// Liveness does not rest on these wake-ups: every waiting Job still tries
// at least every waitingRequeue, and a queue entry whose owner stops trying
// is pruned by the store after its waiter TTL. A wake-up only makes a
// handover fast. The cases where the one woken waiter cannot take its turn:
//   - its Job is being deleted or has ended: its reconcile releases it and
//     leaves the queue, and a Job that leaves without holding wakes its keys
//     again (release), so the next waiter is woken at once;
//   - its Job is gone (no Job of that name and UID in the cache: deleted
//     without the finalizer, replaced, unlabelled): its entry would hold the
//     head until the waiter TTL prunes it, so the wake-up removes it from the
//     queue (Dequeue with the owner token derived from the waiter's holder
//     identity, as the lock controller does for its manual holders) and
//     gives the slot to the next waiter;
//   - the waiter is not a Job of this operator (a manual holder, another
//     cluster's Job, another program): it takes the slot itself;
//   - the store does not answer: every waiting Job is woken, as before.
//
// Should all of that fail (a lost notification, a Dequeue that fails), the
// next waiter acquires at its periodic requeue once the entry ahead of it is
// pruned: a delay of at most the waiter TTL plus waitingRequeue, never a
// waiter blocked for good.

// wakeKey is a key, on a backend, whose waiters may have a turn.
type wakeKey struct{ backendID, key string }

const (
	// wakeWorkers bounds how many keys are inspected for wake-ups at once:
	// one slow backend does not hold the wake-ups of the others.
	wakeWorkers = 4
	// wakeTimeout bounds the Inspect (and the Dequeues of gone waiters) of
	// one wake-up.
	wakeTimeout = 5 * time.Second
)

func newWakeQueue() workqueue.TypedDelayingInterface[wakeKey] {
	return workqueue.NewTypedDelayingQueue[wakeKey]()
}

// wakeRunner works through the Job reconciler's wake-ups. The queue
// coalesces: the releases of one key that arrive while it waits (or while
// it is inspected) cost one more Inspect at most, not one each. The gate
// (wakeGate) keeps one backend's wake-ups from taking the others'.
type wakeRunner struct{ r *JobReconciler }

// NeedLeaderElection makes the wake-ups run where the reconciles run: on the leader.
func (w wakeRunner) NeedLeaderElection() bool { return true }

// Start works until ctx ends.
func (w wakeRunner) Start(ctx context.Context) error {
	q := w.r.wakes
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	done := make(chan struct{}, wakeWorkers)
	for range wakeWorkers {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				k, shutdown := q.Get()
				if shutdown {
					return
				}
				leave, retry, ok := w.r.wakeGate.enter(k.backendID, time.Now())
				if !ok {
					q.Done(k)
					q.AddAfter(k, retry)
					continue
				}
				w.r.wakeTurn(ctx, k)
				leave()
				q.Done(k)
			}
		}()
	}
	for range wakeWorkers {
		<-done
	}
	return nil
}

// wakeKeys asks for the wake-up of the waiters of keys on the backend.
func (r *JobReconciler) wakeKeys(backendID string, keys ...string) {
	for _, k := range keys {
		r.wakes.Add(wakeKey{backendID: backendID, key: k})
	}
}

// wakeLock asks for the wake-up of the waiters of dl's keys (of the Job's
// key, for a lock that derives keys).
func (r *JobReconciler) wakeLock(g *gatedJob) {
	switch {
	case g.dl == nil:
	case g.dl.Spec.KeyFrom != nil:
		r.wakeKeys(backend.LockBackendID(g.dl), g.keys...)
	default:
		r.wakeKeys(backend.LockBackendID(g.dl), backend.EngineKeys(g.dl)...)
	}
}

// lockJobs is a lock on a woken key and its Jobs.
type lockJobs struct {
	dl *locksv1alpha1.DistributedLock
	// keys are the store-side keys its Jobs on the woken key take: the
	// lock's, or for a lock that derives keys the woken key alone (and jobs
	// are only those with that key).
	keys []string
	jobs []batchv1.Job
}

// wakeTurn wakes the waiting Jobs whose turn it is on one key: one Inspect,
// then a reconcile for each Job that a free slot goes to.
func (r *JobReconciler) wakeTurn(ctx context.Context, k wakeKey) {
	var locks, lanes locksv1alpha1.DistributedLockList
	if err := r.Client.List(ctx, &locks, client.MatchingFields{indexBackendKey: backendKeyValues(k.backendID, k.key)[0]}); err != nil {
		r.Log.Error(err, "Listing the locks of a released key failed; their waiting Jobs try again at their next requeue", "key", k.key)
		return
	}
	// The locks that derive keys in the key's scope: the key may be one of theirs.
	if prefix, ok := backend.ScopePrefix(k.key); ok {
		if err := r.Client.List(ctx, &lanes, client.MatchingFields{indexBackendKey: backendKeyValues(k.backendID, prefix)[0]}); err != nil {
			r.Log.Error(err, "Listing the locks of a released key failed; their waiting Jobs try again at their next requeue", "key", k.key)
			return
		}
	}
	if len(locks.Items)+len(lanes.Items) == 0 {
		return
	}
	of := make([]lockJobs, 0, len(locks.Items)+len(lanes.Items))
	for i, all := 0, append(locks.Items, lanes.Items...); i < len(all); i++ {
		dl := &all[i]
		var jobs batchv1.JobList
		if err := r.Client.List(ctx, &jobs, client.InNamespace(dl.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: dl.Name}); err != nil {
			r.Log.Error(err, "Listing the Jobs of a lock failed; they try again at their next requeue", "lock", klog.KObj(dl))
			continue
		}
		lj := lockJobs{dl: dl, keys: backend.EngineKeys(dl), jobs: jobs.Items}
		if dl.Spec.KeyFrom != nil {
			lj.keys = []string{k.key}
			lj.jobs = slices.DeleteFunc(lj.jobs, func(j batchv1.Job) bool {
				keys, err := backend.WorkloadKeys(dl, j.Annotations)
				return err != nil || keys[0] != k.key
			})
		}
		of = append(of, lj)
	}
	wakeAll := func(why string, err error) {
		r.Log.V(1).Info("Waking every waiting Job of a released key", "backend", k.backendID, "key", k.key, "why", why, "error", errString(err))
		for _, lj := range of {
			r.enqueueWaiting(lj.jobs)
		}
	}
	h, ok := r.Registry.Open(k.backendID)
	if !ok {
		wakeAll("the backend is not open", nil)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	states, err := h.Locker.Inspect(ctx, []string{k.key})
	if err != nil || len(states) != 1 {
		wakeAll("inspecting the key failed", err)
		return
	}
	p := planWake(r.ClusterName, of, states[0])
	for _, g := range p.gone {
		if err := h.Locker.Dequeue(ctx, g.keys, r.Tokens.Owner(g.holder)); err != nil {
			r.Log.V(1).Info("Removing the queue entry of a gone Job failed; it expires without heartbeats", "holder", g.holder.Identity, "error", err.Error())
		}
	}
	for _, nn := range p.wake {
		r.waits.clearPlace(nn) // it tries the store
		r.enqueue(nn)
	}
	now := r.Clock.Now()
	for nn, busy := range p.places {
		r.waits.setPlace(nn, busy, now)
		r.enqueue(nn)
	}
	if p.all {
		for _, lj := range of {
			for i := range lj.jobs {
				j := &lj.jobs[i]
				if nn := client.ObjectKeyFromObject(j); phaseOf(j) == phaseWaiting && !p.woken[nn] {
					r.enqueue(nn)
				}
			}
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// wakePlan is who a wake-up wakes.
type wakePlan struct {
	// wake are the Jobs the free slots go to, in queue order.
	wake  []types.NamespacedName
	woken map[types.NamespacedName]bool
	// gone are queue entries of this operator's Jobs that no longer exist
	// ahead of them: removed, so that the slot goes to the next waiter.
	gone []goneWaiter
	// all: slots remain for waiters Inspect does not name (deeper in the
	// queue than it lists, or not queued): every other waiting Job is woken.
	all bool
	// places are the places in the queue of the Jobs Inspect lists, when
	// no slot is free (nobody is about to move up): they are shown without
	// a call to the store.
	places map[types.NamespacedName]*lock.HeldError
}

// goneWaiter is the queue entry of a Job that is gone.
type goneWaiter struct {
	holder holder.Holder
	keys   []string
}

// planWake decides whom a key's state s wakes. The slots free are the
// largest limit of the locks on the key (their maxHolders; every lock on a
// key should give the same) minus the key's holders; the oldest waiters get
// them. Each waiter that is a Job of one of these locks (by the holder
// identity its reconcile gave: cluster, namespace, lock, Job name and UID)
// is woken; a waiter that is such a Job but has no Job in the cache is gone
// and gets no slot; any other waiter takes its slot itself. When slots
// remain after the waiters Inspect lists (an empty queue, or more free slots
// than it lists), every waiting Job is woken: some of them are not queued
// (new, or pruned), and the slot is theirs.
//
// When no slot is free (a Job just took the last one, or a waiter left the
// queue of a held key), the waiters Inspect lists have moved up, and their
// places are returned to be shown: the key's first holder and the place of
// each among the live waiters, as TryAcquire would report them. (Only
// from the first key of a Job's lock: the one its place is shown for.)
func planWake(cluster string, locks []lockJobs, s lock.KeyState) wakePlan {
	p := wakePlan{woken: map[types.NamespacedName]bool{}, places: map[types.NamespacedName]*lock.HeldError{}}
	limit := 0
	for _, lj := range locks {
		limit = max(limit, maxHolders(lj.dl))
	}
	holders := holderCount(s)
	free := limit - holders
	settled := free <= 0
	queued := queueLength(s)
	pos := 0
	for _, w := range s.Waiters {
		if free <= 0 && !settled {
			break
		}
		h := holder.Decode(w.Holder)
		lj := lockOf(cluster, locks, h)
		if lj == nil {
			free-- // not one of these locks' Jobs: it takes the slot itself
			pos++
			continue
		}
		j := jobOf(lj.jobs, h)
		if j == nil {
			p.gone = append(p.gone, goneWaiter{holder: h, keys: lj.keys})
			queued--
			continue
		}
		nn := client.ObjectKeyFromObject(j)
		switch {
		case settled:
			if len(lj.keys) > 0 && lj.keys[0] == s.Key && phaseOf(j) == phaseWaiting {
				p.places[nn] = &lock.HeldError{Key: s.Key, Holder: s.Holder, Fence: s.Fence, Position: pos, Holders: holders}
			}
		case !p.woken[nn]:
			p.wake = append(p.wake, nn)
			p.woken[nn] = true
			free--
		}
		pos++
	}
	for _, b := range p.places {
		b.Waiters = max(queued, b.Position+1)
	}
	p.all = free > 0
	return p
}

// lockOf returns the lock, among locks, that h waits through as a Job of
// this operator's cluster.
func lockOf(cluster string, locks []lockJobs, h holder.Holder) *lockJobs {
	if h.Kind != jobKind {
		return nil
	}
	for i := range locks {
		if dl := locks[i].dl; h.Of(cluster, dl.Namespace, dl.Name) {
			return &locks[i]
		}
	}
	return nil
}

// jobOf returns the Job h names (its name and UID), if it exists.
func jobOf(jobs []batchv1.Job, h holder.Holder) *batchv1.Job {
	for i := range jobs {
		if j := &jobs[i]; j.Name == h.Name && string(j.UID) == h.UID {
			return j
		}
	}
	return nil
}
