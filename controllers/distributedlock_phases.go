package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/keyfrom"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// observation is what one reconcile learned from the cluster and the backend.
type observation struct {
	now time.Time
	// scopeDenied explains why scope Global is not allowed here ("" when allowed).
	scopeDenied string
	// backendErr is why the backend cannot be used or did not answer (nil: it answered).
	backendErr    error
	backendReason string
	handle        backend.Handle
	// leave gives back the backend's reconcile slot (Handle.Enter); nil
	// when none was taken.
	leave func()
	keys  []string
	// lanes is how many derived keys the workloads of a lock with keyFrom
	// use in this cluster; keys are the first maxLanesInspected of them.
	lanes int
	// states is what the backend holds for each key.
	states []lock.KeyState
	// mine is the lease this lock's manual holder holds, if any.
	mine *lock.Lease
	// waiting is set when the manual holder waits in the queue; busy says for whom.
	waiting bool
	busy    *lock.HeldError
	// lost is a lost lease not shown in status yet: reported by the
	// watchdog, or found by this reconcile.
	lost *watchdog.Lost
	// rolloutBlocked explains the Deployment rollout found waiting for
	// this lock, which its own old Pods hold ("" when none).
	rolloutBlocked string
	// backendWasDown: status showed the backend unready before this reconcile.
	backendWasDown bool
	// knownDown: the backend's health check says it does not answer; this
	// reconcile did not try it.
	knownDown bool
	// holdEnded says why the manual holder's hold ended (its until or
	// maxHoldSeconds passed); holdEnds is when a running hold will end.
	holdEnded string
	holdEnds  time.Time
	// holdEndedShown: the hold ended before this operator started, and
	// status already says why.
	holdEndedShown bool
	// events are recorded once the status is written.
	events []pendingEvent
	// deleting: the lock is being deleted; no status is written from states.
	deleting bool
	// holds is what spec.holds say now (distributedlock_holds.go).
	holds holdsView
	// cooldownUntil is when the lease cooling down after its holder's
	// release (cooldownHolder) expires; zero when none cools down.
	cooldownUntil  time.Time
	cooldownHolder string
}

type pendingEvent struct{ reason, action, note string }

// event adds a Normal Event to record on the lock after the status write.
func (o *observation) event(reason, action, format string, args ...any) {
	o.events = append(o.events, pendingEvent{reason, action, fmt.Sprintf(format, args...)})
}

func (o *observation) ready() bool { return o.scopeDenied == "" && o.backendErr == nil }

func (r *DistributedLockReconciler) ref(dl *locksv1alpha1.DistributedLock) holder.Ref {
	return holder.Ref{Kind: lockKind, Namespace: dl.Namespace, Name: dl.Name}
}

// manualHolder returns the holder record of dl's spec.holder.
func (r *DistributedLockReconciler) manualHolder(dl *locksv1alpha1.DistributedLock, identity string) holder.Holder {
	return holder.Holder{
		Cluster: r.ClusterName, Namespace: dl.Namespace, Lock: dl.Name,
		Kind: lockKind, Name: dl.Name, UID: string(dl.UID), Identity: identity,
	}
}

// gather checks the scope, builds the backend and reads what it holds. It
// writes nothing: Events, metrics and one-shot signals are handled by
// report, after the status that shows them was written.
func (r *DistributedLockReconciler) gather(ctx context.Context, dl *locksv1alpha1.DistributedLock) *observation {
	obs := &observation{now: r.Clock.Now(), keys: backend.EngineKeys(dl), backendWasDown: backendWasDown(dl)}
	obs.rolloutBlocked = r.rollouts.of(client.ObjectKeyFromObject(dl), obs.now)
	if l, ok := r.lostOf(client.ObjectKeyFromObject(dl)); ok {
		obs.lost = &l
	}
	h, err := r.Registry.For(ctx, r.ref(dl), dl)
	if err == nil {
		// A backend known to be down fails at once, without a connection
		// attempt: unreachable backends do not hold the shared workers.
		err = h.Health()
		obs.knownDown = err != nil && !errors.Is(err, backend.ErrConnecting)
	}
	if err == nil {
		// One slow backend may hold only its share of the shared workers.
		if leave, ok := h.Enter(); ok {
			obs.leave = leave
		} else {
			err = backend.ErrBusy
		}
	}
	if err != nil {
		obs.backendErr = err
		var pe *backend.PolicyError
		var se *backend.SecretError
		switch {
		case errors.As(err, &pe) && pe.Reason == locksv1alpha1.ReasonScopeNotAllowed:
			obs.scopeDenied, obs.backendErr = pe.Error(), nil
		case errors.As(err, &pe):
			obs.backendReason = pe.Reason
		case errors.As(err, &se):
			obs.backendReason = locksv1alpha1.ReasonSecretNotFound
		case errors.Is(err, backend.ErrConnecting), errors.Is(err, backend.ErrBusy):
			obs.backendReason = locksv1alpha1.ReasonConnecting
		case h.Locker != nil:
			obs.backendReason = locksv1alpha1.ReasonBackendUnreachable
		default:
			obs.backendReason = locksv1alpha1.ReasonInvalidBackend
		}
		return obs
	}
	obs.handle = h
	if dl.Spec.KeyFrom != nil {
		lanes, err := keyfrom.InUse(ctx, r.Client, dl)
		if err != nil {
			// The cache answers from memory; should it fail, the lanes are
			// shown at the next reconcile.
			logf.FromContext(ctx).Error(err, "Listing the derived keys of the lock failed")
		}
		obs.lanes = len(lanes)
		obs.keys = make([]string, 0, min(len(lanes), maxLanesInspected))
		for _, k := range lanes[:min(len(lanes), maxLanesInspected)] {
			obs.keys = append(obs.keys, backend.EngineKey(dl.Namespace, dl.Spec.Scope, k))
		}
		if len(obs.keys) == 0 {
			return obs // nothing in use: nothing to read
		}
	}
	states, err := h.Locker.Inspect(ctx, obs.keys)
	if err != nil {
		obs.backendErr, obs.backendReason = err, locksv1alpha1.ReasonBackendUnreachable
		return obs
	}
	obs.states = states
	if l, _, ok := r.Watchdog.Holding(r.ref(dl)); ok {
		obs.mine = l
	}
	r.observeCooldown(dl, obs)
	return obs
}

// recordEvents records the Events a reconcile collected in obs.
func (r *DistributedLockReconciler) recordEvents(dl *locksv1alpha1.DistributedLock, obs *observation) {
	for _, e := range obs.events {
		r.Recorder.Eventf(dl, nil, corev1.EventTypeNormal, e.reason, e.action, "%s", e.note)
	}
}

// report emits what a reconcile found, once its status is written: Events,
// metrics, and the end of the one-shot lost signal it showed.
func (r *DistributedLockReconciler) report(dl *locksv1alpha1.DistributedLock, obs *observation) {
	if obs.scopeDenied != "" {
		r.warnOnce(dl, locksv1alpha1.EventScopeNotAllowed, "%s", obs.scopeDenied)
	}
	if ttl := time.Duration(dl.Spec.TTLSeconds) * time.Second; r.MinSafeTTL > 0 && ttl < r.MinSafeTTL {
		r.warnOnce(dl, locksv1alpha1.EventShortTTL,
			"spec.ttlSeconds %d is shorter than %v, the longest failover of the operator's leader: a lease may expire while a new leader takes over",
			dl.Spec.TTLSeconds, r.MinSafeTTL)
	}
	switch {
	case obs.scopeDenied != "":
	case obs.backendErr != nil:
		metrics.BackendUp.WithLabelValues(dl.Namespace, dl.Name).Set(0)
		switch obs.backendReason {
		case locksv1alpha1.ReasonConnecting:
		case locksv1alpha1.ReasonBackendUnreachable:
			if !obs.backendWasDown {
				r.Recorder.Eventf(dl, nil, corev1.EventTypeWarning, locksv1alpha1.EventBackendUnavailable, "Inspect", "The store did not answer: %s", backend.Describe(obs.backendErr))
			}
		case locksv1alpha1.ReasonBackendNotAllowed, locksv1alpha1.ReasonBackendNotFound:
			r.warnOnce(dl, locksv1alpha1.EventBackendNotAllowed, "%s", backend.Describe(obs.backendErr))
		default:
			r.warnOnce(dl, locksv1alpha1.EventBackendUnavailable, "%s", backend.Describe(obs.backendErr))
		}
	default:
		metrics.BackendUp.WithLabelValues(dl.Namespace, dl.Name).Set(1)
		if dl.Spec.KeyFrom != nil {
			// Summed over the lanes: metrics carry no per-key label.
			var queued, holders int
			var oldest float64
			for _, s := range obs.states {
				queued, holders, oldest = queued+queueLength(s), holders+holderCount(s), max(oldest, oldestWaiter(s))
			}
			metrics.QueueDepth.WithLabelValues(dl.Namespace, dl.Name).Set(float64(queued))
			metrics.OldestWaiter.WithLabelValues(dl.Namespace, dl.Name).Set(oldest)
			metrics.LockHolders.WithLabelValues(dl.Namespace, dl.Name).Set(float64(holders))
		} else if len(obs.states) > 0 {
			metrics.QueueDepth.WithLabelValues(dl.Namespace, dl.Name).Set(float64(queueLength(obs.states[0])))
			metrics.OldestWaiter.WithLabelValues(dl.Namespace, dl.Name).Set(oldestWaiter(obs.states[0]))
			metrics.LockHolders.WithLabelValues(dl.Namespace, dl.Name).Set(float64(holderCount(obs.states[0])))
		}
	}
	if obs.lost != nil {
		r.Recorder.Eventf(dl, nil, corev1.EventTypeWarning, locksv1alpha1.EventLost, "Renew",
			"Lost the lease of %s (fencing token %d): %s", holder.Decode(obs.lost.Lease.Holder).Shown().Identity, obs.lost.Lease.Fence, backend.Describe(obs.lost.Err))
		r.clearLost(client.ObjectKeyFromObject(dl), *obs.lost)
	}
	r.recordEvents(dl, obs)
}

func backendWasDown(dl *locksv1alpha1.DistributedLock) bool {
	for _, c := range dl.Status.Conditions {
		if c.Type == locksv1alpha1.ConditionBackendReady {
			return c.Status != "True"
		}
	}
	return false
}

// reconcileHolder acquires, keeps or releases the lease of the manual holder
// so that the backend matches spec.holder.
func (r *DistributedLockReconciler) reconcileHolder(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation) {
	var want *holder.Holder
	if dl.Spec.Holder != nil {
		h := r.manualHolder(dl, dl.Spec.Holder.Identity)
		want = &h
		nn := client.ObjectKeyFromObject(dl)
		if why, ended := r.endedBefore(dl); ended {
			// Ended for this generation of the spec: stays released, also
			// when this reconcile reads a cache that does not show it yet.
			obs.holdEnded, obs.holdEndedShown = why, why == ""
			want = nil
		} else if end, why, ok := r.holdEnd(dl, obs, h); ok && !obs.now.Before(end) {
			// The hold is over: release it (below, as for a removed holder)
			// and acquire nothing until the spec changes.
			obs.holdEnded = why
			want = nil
			r.mu.Lock()
			r.holdEnded[nn] = endedHold{generation: dl.Generation, why: why}
			r.mu.Unlock()
			obs.event(locksv1alpha1.EventHoldEnded, "Release",
				"The hold of %s ended: %s; it does not hold or wait any more", h.Identity, why)
		} else if ok {
			obs.holdEnds = end
		}
	}
	if w := obs.holds.open; w != nil {
		if want != nil {
			// One operator-held holder at a time: the manual one.
			obs.holds.manualFirst = true
		} else {
			h := r.holdHolder(dl, w.name)
			want = &h
		}
	}
	// Release what this lock holds for anyone other than the wanted holder
	// (the holder was removed or renamed), including leases held before a restart.
	r.releaseStale(ctx, dl, obs, want)
	if want == nil {
		return
	}
	if obs.mine != nil && obs.mine.Holder == want.Encode() {
		if _, ok := heldBy(obs.states, want.Encode()); ok {
			// Held and renewed by the watchdog; renew through the current
			// client (it changes when a referenced Secret changed).
			r.Watchdog.Hold(r.ref(dl), obs.handle.Locker, obs.mine)
			return
		}
		// The backend no longer holds what the watchdog renews (it lost its
		// data, or the lease expired during an outage): that is a lost
		// lease, reported before any new acquisition.
		r.reportLost(dl, obs, fmt.Errorf("%w: the backend no longer holds the keys for this owner", lock.ErrLost))
	}
	r.acquire(ctx, dl, obs, *want)
	if isHold(want.Encode()) {
		return
	}
	if end, _, ok := r.holdEnd(dl, obs, *want); ok && obs.mine != nil {
		obs.holdEnds = end // known now that it holds
	}
}

// endedBefore tells whether the manual hold of this generation of the spec
// ended already, and why: from memory, or after a restart from status (why
// empty: status keeps its message).
func (r *DistributedLockReconciler) endedBefore(dl *locksv1alpha1.DistributedLock) (string, bool) {
	r.mu.Lock()
	e, ok := r.holdEnded[client.ObjectKeyFromObject(dl)]
	r.mu.Unlock()
	if ok && e.generation == dl.Generation {
		return e.why, true
	}
	c := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionManualHolderHeld)
	return "", c != nil && c.Reason == locksv1alpha1.ReasonHoldEnded && c.ObservedGeneration == dl.Generation
}

// holdEnd returns when the manual holder's hold ends (spec.holder.until, or
// maxHoldSeconds after it acquired) and why; ok is false while it has no end.
// A hold that ended for this generation of the spec stays ended (status
// says so), so that the released holder does not queue again.
func (r *DistributedLockReconciler) holdEnd(dl *locksv1alpha1.DistributedLock, obs *observation, h holder.Holder) (end time.Time, why string, ok bool) {
	spec := dl.Spec.Holder
	if spec.Until != nil {
		end, why, ok = spec.Until.Time, fmt.Sprintf("spec.holder.until (%s) passed", spec.Until.UTC().Format(time.RFC3339)), true
	}
	if spec.MaxHoldSeconds > 0 {
		acquired := time.Time{}
		if obs.mine != nil && obs.mine.Holder == h.Encode() {
			acquired = obs.mine.Acquired
		}
		if hs, held := heldBy(obs.states, h.Encode()); held && !hs.Acquired.IsZero() {
			acquired = hs.Acquired
		}
		if !acquired.IsZero() {
			d := time.Duration(spec.MaxHoldSeconds) * time.Second
			if e := acquired.Add(d); !ok || e.Before(end) {
				end, why, ok = e, fmt.Sprintf("spec.holder.maxHoldSeconds (%v) passed since it acquired at %s", d, acquired.UTC().Format(time.RFC3339)), true
			}
		}
	}
	return end, why, ok
}

// releaseUnwanted releases, through the client the watchdog renews it with,
// a lease of this lock whose manual holder was removed or renamed while the
// lock cannot use its backend (the policy refuses it now, or it is down). A
// lease still wanted stays held: a policy change does not cut off work that
// already holds the lock.
func (r *DistributedLockReconciler) releaseUnwanted(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation) {
	l, locker, ok := r.Watchdog.Holding(r.ref(dl))
	if !ok || (dl.Spec.Holder != nil && l.Holder == r.manualHolder(dl, dl.Spec.Holder.Identity).Encode()) {
		return
	}
	if w := obs.holds.open; w != nil && dl.Spec.Holder == nil && l.Holder == r.holdHolder(dl, w.name).Encode() {
		return // the open window's hold
	}
	r.Watchdog.Drop(r.ref(dl))
	until, err := releaseOrCool(ctx, locker, l, r.cooldownFor(dl, obs, l), obs.now)
	switch {
	case err == nil:
		metrics.HoldSeconds.WithLabelValues(lockKind).Observe(obs.now.Sub(l.Acquired).Seconds())
		obs.event(locksv1alpha1.EventReleased, "Release",
			"Released the keys held by %s (fencing token %d)%s", holder.Decode(l.Holder).Shown().Identity, l.Fence, cooldownNote(until))
	case errors.Is(err, lock.ErrNotHeld):
	default:
		logf.FromContext(ctx).Error(err, "Releasing lease failed; it expires with its TTL", "holder", holder.Decode(l.Holder).Identity)
	}
}

// reportLost records the loss of the lease the watchdog renewed for dl; it
// is shown (and its Event recorded) like a loss the watchdog reported.
func (r *DistributedLockReconciler) reportLost(dl *locksv1alpha1.DistributedLock, obs *observation, cause error) {
	l := r.Watchdog.Drop(r.ref(dl))
	if l == nil {
		l = obs.mine
	}
	obs.mine = nil
	metrics.LeasesLost.WithLabelValues(lockKind).Inc()
	lost := watchdog.Lost{Ref: r.ref(dl), Lease: l, Err: cause}
	r.recordLost(client.ObjectKeyFromObject(dl), lost)
	obs.lost = &lost
}

// maxHolders is the lock's spec.maxHolders as a lock.Request Limit.
func maxHolders(dl *locksv1alpha1.DistributedLock) int { return max(int(dl.Spec.MaxHolders), 1) }

// queueLength is the exact number of waiters for a key (Queued), or what
// Inspect listed when the backend does not count.
func queueLength(s lock.KeyState) int { return max(s.Queued, len(s.Waiters)) }

// oldestWaiter is when the head of a key's queue joined it, in Unix seconds
// (Waiters are oldest first), or 0 when nobody waits.
func oldestWaiter(s lock.KeyState) float64 {
	if len(s.Waiters) == 0 || s.Waiters[0].Since.IsZero() {
		return 0
	}
	return float64(s.Waiters[0].Since.UnixMilli()) / 1000
}

// holdersOf returns the leases holding a key, oldest first: its Holders, or
// for a backend that reports only one holder, that one.
func holdersOf(s lock.KeyState) []lock.HolderState {
	if len(s.Holders) > 0 || !s.Held {
		return s.Holders
	}
	return []lock.HolderState{{Holder: s.Holder, Fence: s.Fence, Acquired: s.Acquired, Expires: s.Expires}}
}

// holderCount is the exact number of leases holding a key.
func holderCount(s lock.KeyState) int {
	return max(s.HolderCount, len(holdersOf(s)))
}

// slotsTaken is the slots the leases holding a key take: each its weight
// (at least 1), and 1 for each lease beyond those listed.
func slotsTaken(s lock.KeyState) int {
	hs := holdersOf(s)
	n := holderCount(s) - len(hs)
	for _, h := range hs {
		n += max(h.Weight, 1)
	}
	return n
}

// holding returns the lease state of the holder string h on a key, if it holds it.
func holding(s lock.KeyState, h string) (lock.HolderState, bool) {
	for _, hs := range holdersOf(s) {
		if hs.Holder == h {
			return hs, true
		}
	}
	return lock.HolderState{}, false
}

// heldBy reports whether the holder string h holds every key; it returns
// its state on the first key (fencing token, acquisition time).
func heldBy(states []lock.KeyState, h string) (lock.HolderState, bool) {
	var first lock.HolderState
	for i, s := range states {
		hs, ok := holding(s, h)
		if !ok {
			return lock.HolderState{}, false
		}
		if i == 0 {
			first = hs
		}
	}
	return first, len(states) > 0
}

// queued reports whether the holder string h waits in the first key's queue.
func queued(states []lock.KeyState, h string) bool {
	if len(states) == 0 {
		return false
	}
	for _, w := range states[0].Waiters {
		if w.Holder == h {
			return true
		}
	}
	return false
}

// releaseStale releases leases of this lock's manual holders other than want.
func (r *DistributedLockReconciler) releaseStale(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation, want *holder.Holder) {
	wantStr := ""
	if want != nil {
		wantStr = want.Encode()
	}
	if obs.mine != nil && obs.mine.Holder != wantStr {
		r.release(ctx, dl, obs, obs.mine)
		obs.mine = nil
	}
	// A lease held by a previous incarnation of this operator: its owner
	// token is derived from the holder string in the store.
	if len(obs.states) > 0 {
		for _, hs := range holdersOf(obs.states[0]) {
			if hs.Holder == wantStr {
				continue
			}
			h := holder.Decode(hs.Holder)
			if h.Kind != lockKind || h.UID != string(dl.UID) || !h.Of(r.ClusterName, dl.Namespace, dl.Name) {
				continue
			}
			if !obs.deleting && cooldownOf(dl) > 0 && !isHold(hs.Holder) {
				// Perhaps cooling down after spec.holder released it: it
				// runs out (distributedlock_holds.go, Cooldown).
				continue
			}
			r.release(ctx, dl, obs, &lock.Lease{Keys: obs.keys, Owner: r.Tokens.Owner(h), Holder: hs.Holder, Fence: hs.Fence, Limit: maxHolders(dl)})
			break
		}
	}
	// Leave the queues for holders that are no longer wanted. A waiter deeper
	// in the queue than Inspect shows drops out when its heartbeats stop.
	dequeued := map[string]bool{}
	for _, s := range obs.states {
		for _, w := range s.Waiters {
			h := holder.Decode(w.Holder)
			if w.Holder == wantStr || dequeued[w.Holder] || h.Kind != lockKind || h.UID != string(dl.UID) {
				continue
			}
			dequeued[w.Holder] = true
			if err := obs.handle.Locker.Dequeue(ctx, obs.keys, r.Tokens.Owner(h)); err != nil {
				logf.FromContext(ctx).V(1).Info("Leaving the queue failed; the entry expires without heartbeats", "holder", h.Identity, "error", err.Error())
			}
		}
	}
}

func (r *DistributedLockReconciler) release(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation, l *lock.Lease) {
	log := logf.FromContext(ctx)
	r.Watchdog.Drop(r.ref(dl))
	until, err := releaseOrCool(ctx, obs.handle.Locker, l, r.cooldownFor(dl, obs, l), obs.now)
	switch {
	case err == nil:
		metrics.HoldSeconds.WithLabelValues(lockKind).Observe(obs.now.Sub(l.Acquired).Seconds())
		obs.event(locksv1alpha1.EventReleased, "Release",
			"Released the keys held by %s (fencing token %d)%s", holder.Decode(l.Holder).Shown().Identity, l.Fence, cooldownNote(until))
		log.Info("Released lease", "holder", holder.Decode(l.Holder).Identity, "fence", l.Fence, "cooldownUntil", until)
	case errors.Is(err, lock.ErrNotHeld):
		log.V(1).Info("Lease was no longer held", "holder", holder.Decode(l.Holder).Identity)
	default:
		// Not renewed any more, the lease ends with its TTL at the latest.
		log.Error(err, "Releasing lease failed; it expires with its TTL", "holder", holder.Decode(l.Holder).Identity)
	}
	if obs.deleting {
		// No status shows what is left: the lock goes.
		return
	}
	if refreshed, err := obs.handle.Locker.Inspect(ctx, obs.keys); err == nil {
		obs.states = refreshed
		r.observeCooldown(dl, obs)
	}
}

// cooldownFor is the cooldown that follows the release of the lease l of
// this lock's manual holder: spec.cooldownSeconds, but none when a hold
// window closes (its end is the documented end) or the lock is deleted.
func (r *DistributedLockReconciler) cooldownFor(dl *locksv1alpha1.DistributedLock, obs *observation, l *lock.Lease) time.Duration {
	if obs.deleting || isHold(l.Holder) {
		return 0
	}
	return cooldownOf(dl)
}

// acquire takes the keys for the manual holder: it first tries to recover a
// lease this holder already holds (after a restart or a leader change), then
// to acquire, waiting its turn in the queue.
func (r *DistributedLockReconciler) acquire(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation, h holder.Holder) {
	log := logf.FromContext(ctx)
	ttl := time.Duration(dl.Spec.TTLSeconds) * time.Second
	owner := r.Tokens.Owner(h)
	nn := client.ObjectKeyFromObject(dl)
	if hs, ok := heldBy(obs.states, h.Encode()); ok {
		renewed, err := obs.handle.Locker.Renew(ctx, &lock.Lease{Keys: obs.keys, Owner: owner, Holder: h.Encode(), TTL: ttl, Fence: hs.Fence, Acquired: hs.Acquired, Limit: maxHolders(dl)}, ttl)
		if err == nil {
			if renewed.Fence == 0 {
				renewed.Fence = hs.Fence
			}
			if !hs.Acquired.IsZero() {
				// The hold began at the first acquisition, not at this recovery.
				renewed.Acquired = hs.Acquired
			}
			r.Watchdog.Hold(r.ref(dl), obs.handle.Locker, renewed)
			obs.mine = renewed
			log.Info("Recovered held lease", "holder", h.Identity, "fence", renewed.Fence)
			return
		}
		log.Info("Could not recover held lease; acquiring anew", "holder", h.Identity, "error", err.Error())
	}
	lease, err := obs.handle.Locker.TryAcquire(ctx, lock.Request{Keys: obs.keys, TTL: ttl, Owner: owner, Holder: h.Encode(), Queue: true, Limit: maxHolders(dl)})
	var busy *lock.HeldError
	switch {
	case err == nil:
		metrics.Acquisitions.WithLabelValues(lockKind, metrics.ResultAcquired).Inc()
		since := r.stopWaiting(nn, obs.now)
		metrics.WaitSeconds.WithLabelValues(lockKind).Observe(r.Clock.Since(since).Seconds())
		r.Watchdog.Hold(r.ref(dl), obs.handle.Locker, lease)
		obs.mine, obs.waiting, obs.busy = lease, false, nil
		if states, err := obs.handle.Locker.Inspect(ctx, obs.keys); err == nil {
			obs.states = states
		}
		obs.event(locksv1alpha1.EventAcquired, "Acquire",
			"Acquired %v for %s with fencing token %d", dl.Spec.Keys, h.Identity, lease.Fence)
		log.Info("Acquired lease", "holder", h.Identity, "fence", lease.Fence)
	case errors.As(err, &busy):
		metrics.Acquisitions.WithLabelValues(lockKind, metrics.ResultBusy).Inc()
		r.startWaiting(nn, obs.now)
		obs.waiting, obs.busy = true, busy
		if !queued(obs.states, h.Encode()) {
			// Joined the queue just now: show it.
			if states, err := obs.handle.Locker.Inspect(ctx, obs.keys); err == nil {
				obs.states = states
			}
		}
		log.V(1).Info("Waiting for lock", "holder", h.Identity, "heldBy", busy.Holder, "position", busy.Position)
	case errors.Is(err, lock.ErrReplaced):
		// A newer Job with ReplaceQueued or CancelInProgress dropped the
		// manual holder from the queue: the store refuses it until the
		// replacement lapses (two waiter TTLs at most), then it joins the
		// queue again at the back.
		metrics.Acquisitions.WithLabelValues(lockKind, metrics.ResultBusy).Inc()
		obs.waiting, obs.busy = true, &lock.HeldError{Key: obs.keys[0], Position: -1}
		obs.event(locksv1alpha1.EventReplaced, "Acquire",
			"%s lost its place in the queue: a newer workload with contention ReplaceQueued or CancelInProgress replaced it; it joins the queue again at the back within a minute", h.Identity)
		log.Info("Manual holder replaced in the queue; joining again when the replacement lapses", "holder", h.Identity)
	case errors.As(err, new(*lock.InvalidRequestError)):
		// The lock asks for what its backend refuses (every store has
		// semaphores today; a store may still refuse a request): say so,
		// with the limit asked for.
		metrics.Acquisitions.WithLabelValues(lockKind, metrics.ResultError).Inc()
		obs.backendErr = fmt.Errorf("the backend refuses the lock's request (spec.maxHolders %d): %w", dl.Spec.MaxHolders, err)
		obs.backendReason = locksv1alpha1.ReasonInvalidBackend
		log.Info("The lock asks for more than its backend can do", "error", err.Error())
	default:
		metrics.Acquisitions.WithLabelValues(lockKind, metrics.ResultError).Inc()
		obs.backendErr, obs.backendReason = err, locksv1alpha1.ReasonBackendUnreachable
		log.Error(err, "Acquiring lease failed", "holder", h.Identity)
	}
}

// reconcileDelete releases the manual holder's lease and leaves the queues,
// then lets the lock go.
func (r *DistributedLockReconciler) reconcileDelete(ctx context.Context, dl *locksv1alpha1.DistributedLock) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(dl, locksv1alpha1.Finalizer) {
		return ctrl.Result{}, nil
	}
	obs := r.gather(ctx, dl)
	defer obs.done()
	if errors.Is(obs.backendErr, backend.ErrBusy) {
		return ctrl.Result{RequeueAfter: busyRequeue()}, nil
	}
	obs.deleting = true
	if errors.Is(obs.backendErr, backend.ErrConnecting) {
		// Known in a moment: release then, rather than let the lease expire.
		return ctrl.Result{RequeueAfter: connectingRequeue}, nil
	}
	if obs.backendErr == nil && obs.scopeDenied == "" {
		r.releaseStale(ctx, dl, obs, nil)
		r.recordEvents(dl, obs)
	} else if l, locker, ok := r.Watchdog.Holding(r.ref(dl)); ok {
		// The lock cannot use its backend now (refused, or down): release
		// through the client the lease was renewed with; if that fails, the
		// lease is no longer renewed and ends with its TTL.
		r.Watchdog.Drop(r.ref(dl))
		if err := locker.Release(ctx, l); err != nil && !errors.Is(err, lock.ErrNotHeld) {
			logf.FromContext(ctx).Info("Backend unavailable while deleting; the lease expires with its TTL", "fence", l.Fence, "error", backend.Describe(err))
		}
	}
	r.dropLockState(client.ObjectKeyFromObject(dl))
	controllerutil.RemoveFinalizer(dl, locksv1alpha1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, dl))
}

// dropLockState forgets everything the operator keeps for the lock nn
// beyond its lease: its use of a backend (closed when nobody else uses it),
// the tracker's and the resync's entries, the warnings given and its metric
// series. Deleting a lock calls it; so does a reconcile that finds the lock
// gone (deleted after its finalizer was removed) and the sweep.
func (r *DistributedLockReconciler) dropLockState(nn types.NamespacedName) {
	r.Registry.Forget(holder.Ref{Kind: lockKind, Namespace: nn.Namespace, Name: nn.Name})
	r.forget(nn)
	r.resync.drop(nn)
	r.budget.forget(nn)
	r.mu.Lock()
	delete(r.holdEnded, nn)
	for w := range r.warned {
		if w.nn == nn {
			delete(r.warned, w)
		}
	}
	r.mu.Unlock()
	metrics.DeleteLock(nn)
}

// done gives back what the observation holds of its backend.
func (o *observation) done() {
	if o.leave != nil {
		o.leave()
	}
}
