package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/schedule"
)

// Recurring holds (spec.holds).
//
// While a window is open the lock reconciler acquires and renews the keys
// for the hold exactly as it does for spec.holder: the same holder record
// (kind DistributedLock, this lock's UID), the same owner-token derivation,
// the same watchdog entry, so the same fencing-token rules, recovery after a
// restart and release of stale leases apply. Only the identity differs: a
// hold holds as "hold/<name>". A manual identity may not contain '/', and a
// workload's has five parts, so no other holder can pose as a hold.
//
// A lock has one operator-held holder at a time (one watchdog entry, and a
// mutex cannot be held twice): while spec.holder is set it holds, and an
// open window waits for it to go (HoldActive False, reason
// ManualHolderFirst). The hold queues like any holder: a Job that holds, or
// waits ahead of it, when the window opens runs first; Jobs that join the
// queue during the window wait (Queue) or skip (Skip) until it closes.

// holdIdentityPrefix starts the identity of a recurring hold's holder.
const holdIdentityPrefix = "hold/"

// holdWindow is a window of one of spec.holds.
type holdWindow struct {
	name string
	schedule.Window
}

// holdsView is what spec.holds say at obs.now.
type holdsView struct {
	// open is the window open now (of several, the one that opened first);
	// next the next one to open.
	open, next *holdWindow
	// invalid says why a hold cannot be read ("" when all can).
	invalid string
	// manualFirst: a window is open, but spec.holder holds instead.
	manualFirst bool
}

// observeHolds places the windows of dl's holds around obs.now.
func observeHolds(dl *locksv1alpha1.DistributedLock, now time.Time) holdsView {
	var v holdsView
	for i, spec := range dl.Spec.Holds {
		h, err := schedule.Parse(spec.Schedule, spec.TimeZone, time.Duration(spec.DurationSeconds)*time.Second)
		if err != nil {
			var fe *schedule.FieldError
			if errors.As(err, &fe) {
				v.invalid = fmt.Sprintf("spec.holds[%d].%s: %s", i, fe.Field, fe.Detail)
			} else {
				v.invalid = fmt.Sprintf("spec.holds[%d]: %v", i, err)
			}
			continue
		}
		w, ok, next := h.At(now)
		if ok && (v.open == nil || w.Start.Before(v.open.Start)) {
			v.open = &holdWindow{name: spec.Name, Window: w}
		}
		if !next.IsZero() && (v.next == nil || next.Before(v.next.Start)) {
			v.next = &holdWindow{name: spec.Name, Window: schedule.Window{Start: next, End: next.Add(h.Duration())}}
		}
	}
	return v
}

// holdHolder is the holder record of dl's recurring hold name.
func (r *DistributedLockReconciler) holdHolder(dl *locksv1alpha1.DistributedLock, name string) holder.Holder {
	return r.manualHolder(dl, holdIdentityPrefix+name)
}

// isHold tells whether the holder string s is one of a lock's recurring holds.
func isHold(s string) bool {
	return strings.HasPrefix(holder.Decode(s).Identity, holdIdentityPrefix)
}

// holdWindowEvents records the opening and closing of windows, as status
// last showed them and as they are now.
func holdWindowEvents(dl *locksv1alpha1.DistributedLock, obs *observation) {
	old, open := dl.Status.ActiveHold, obs.holds.open
	same := old != nil && open != nil && old.Name == open.name && old.Start != nil && old.Start.Time.Equal(open.Start.Truncate(time.Second))
	if old != nil && !same {
		obs.event(locksv1alpha1.EventHoldWindowClosed, "Release", "The window of hold %s closed; its hold does not hold or wait any more", old.Name)
	}
	if open != nil && !same {
		obs.event(locksv1alpha1.EventHoldWindowOpened, "Acquire", "The window of hold %s opened; its hold takes the keys in its turn and keeps them until %s",
			open.name, open.End.UTC().Format(time.RFC3339))
	}
}

// holdStatus writes the windows into st.
func holdStatus(obs *observation, st *locksv1alpha1.DistributedLockStatus) {
	if w := obs.holds.open; w != nil {
		start, end := apiTime(w.Start), apiTime(w.End)
		st.ActiveHold = &locksv1alpha1.HoldWindowStatus{Name: w.name, Start: &start, End: &end}
	}
	if w := obs.holds.next; w != nil {
		start, end := apiTime(w.Start), apiTime(w.End)
		st.NextHold = &locksv1alpha1.HoldWindowStatus{Name: w.name, Start: &start, End: &end}
	}
}

// holdWake is when the lock must be looked at again for its holds and its
// cooldown: a window closes or opens, a cooldown ends (zero: never).
func (obs *observation) holdWake() time.Time {
	var at time.Time
	for _, t := range []time.Time{obs.cooldownUntil} {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if w := obs.holds.open; w != nil && (at.IsZero() || w.End.Before(at)) {
		at = w.End
	}
	if w := obs.holds.next; w != nil && (at.IsZero() || w.Start.Before(at)) {
		at = w.Start
	}
	return at
}

// Cooldown (spec.cooldownSeconds).
//
// The cooldown lives in the store, so that it holds for every operator and
// cluster sharing the keys: a holder that releases does not delete its
// lease but renews it once, with the cooldown as its TTL, stops renewing it
// and lets it expire. The lease keeps its holder and fencing token; nobody
// can take the keys meanwhile, and nothing has to be added to any store:
// every store already extends a lease renewed with a longer TTL (the
// conformance suite's renewExtends checks it of each).
// (Refusing acquisitions for a while after a release would need a
// timestamp every store keeps and every acquisition checks: new code in
// each of the five stores.)
//
// Nothing may release such a lease early. Workload holders release only
// leases their own object holds, once (the object is then finished and its
// finalizer gone); the orphan sweep only leases the watchdog renews, and a
// cooling lease is dropped from the watchdog first. The lock reconciler's
// own releaseStale leaves a lease of spec.holder that it does not renew to
// run out when the lock has a cooldown: it may be a cooling one (a lease
// left by an operator that stopped ends with its TTL instead). Deleting
// the lock, and a force release, release at once.

// cooldownOf is a lock's spec.cooldownSeconds (0 without a lock).
func cooldownOf(dl *locksv1alpha1.DistributedLock) time.Duration {
	if dl == nil {
		return 0
	}
	return time.Duration(dl.Spec.CooldownSeconds) * time.Second
}

// releaseOrCool ends a holder's lease: without a cooldown it releases it;
// with one it renews it once with the cooldown as its TTL and leaves it to
// expire, and returns when that is. A lease that was no longer held is
// reported as lock.ErrNotHeld either way.
func releaseOrCool(ctx context.Context, locker lock.Locker, l *lock.Lease, cooldown time.Duration, now time.Time) (time.Time, error) {
	if cooldown <= 0 {
		return time.Time{}, locker.Release(ctx, l)
	}
	if _, err := locker.Renew(ctx, l, cooldown); err != nil {
		if errors.Is(err, lock.ErrPreempted) {
			// A newer Job asked for the key (CancelInProgress): it gets
			// it now, without the cooldown.
			return time.Time{}, locker.Release(ctx, l)
		}
		if errors.Is(err, lock.ErrLost) {
			return time.Time{}, fmt.Errorf("%w: %w", lock.ErrNotHeld, err)
		}
		return time.Time{}, err
	}
	return now.Add(cooldown), nil
}

// cooldownNote is what a release Event adds when the keys cool down.
func cooldownNote(until time.Time) string {
	if until.IsZero() {
		return ""
	}
	return fmt.Sprintf("; the keys stay held until %s (spec.cooldownSeconds)", until.UTC().Format(time.RFC3339))
}

// observeCooldown finds a lease of this lock's holders that cools down:
// with a cooldown, a lease of one of this lock's holders in this cluster
// that this operator does not renew (its holder released it into the
// cooldown), or any lease that expires later than a renewal would put it
// (its ttlSeconds), as one released by another operator does.
func (r *DistributedLockReconciler) observeCooldown(dl *locksv1alpha1.DistributedLock, obs *observation) {
	cooldown := cooldownOf(dl)
	if cooldown <= 0 || len(obs.states) == 0 {
		return
	}
	ttl := time.Duration(dl.Spec.TTLSeconds) * time.Second
	for _, hs := range holdersOf(obs.states[0]) {
		if hs.Expires.IsZero() || !hs.Expires.After(obs.now) || isHold(hs.Holder) {
			continue
		}
		h := holder.Decode(hs.Holder)
		ours := h.Cluster == r.ClusterName && h.Namespace == dl.Namespace && h.Lock == dl.Name
		renewed := false
		if ours {
			if l, _, ok := r.Watchdog.Holding(h.Ref()); ok && l.Holder == hs.Holder {
				renewed = true
			}
		}
		if (ours && !renewed) || hs.Expires.Sub(obs.now) > ttl+time.Second {
			if obs.cooldownUntil.IsZero() || hs.Expires.After(obs.cooldownUntil) {
				obs.cooldownUntil, obs.cooldownHolder = hs.Expires, hs.Holder
			}
		}
	}
}
