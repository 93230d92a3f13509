package controllers

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// maxWaitingInStatus bounds status.waiting, maxHoldersInStatus status.holders.
const (
	maxWaitingInStatus = 10
	maxHoldersInStatus = 10
	// maxBusiestLanes bounds status.lanes.busiest.
	maxBusiestLanes = 5
	// maxLanesInspected bounds the derived keys a lock's reconcile reads
	// from the store (status.lanes counts the keys exactly; holders and
	// waiting are summed over the ones read).
	maxLanesInspected = 1000
)

// computeStatus rebuilds a lock's status from what was observed. Timestamps of
// an unchanged holder are carried over, so that renewals, which move the
// expiry in the store, do not rewrite status.
func computeStatus(dl *locksv1alpha1.DistributedLock, obs *observation, cluster string) locksv1alpha1.DistributedLockStatus {
	old := dl.Status
	st := locksv1alpha1.DistributedLockStatus{
		ObservedGeneration: dl.Generation,
		Conditions:         append([]metav1.Condition(nil), old.Conditions...),
	}
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: dl.Generation})
	}
	holdStatus(obs, &st)
	setHoldActive(dl, obs, set, &st)

	switch {
	case obs.rolloutBlocked != "":
		set(locksv1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, locksv1alpha1.EventRolloutBlocked, obs.rolloutBlocked)
	case meta.IsStatusConditionTrue(st.Conditions, locksv1alpha1.ConditionRolloutBlocked):
		set(locksv1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, locksv1alpha1.ReasonNoBlockedRollout, "No rollout waits for this lock while its own old Pods hold it")
	}

	switch {
	case obs.scopeDenied != "":
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed, obs.scopeDenied)
		setManual(dl, obs, &st, set, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed, obs.scopeDenied)
		meta.RemoveStatusCondition(&st.Conditions, locksv1alpha1.ConditionBackendReady)
		return st
	case obs.backendErr != nil:
		set(locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, obs.backendReason, backend.Describe(obs.backendErr))
		// What the store holds is unknown: keep the last known holder, but say so.
		st.Holder, st.FencingToken, st.AcquiredTime, st.ExpireTime, st.Waiting = old.Holder, old.FencingToken, old.AcquiredTime, old.ExpireTime, old.Waiting
		st.Holders, st.HolderCount, st.Slots, st.QueueLength, st.Lanes = old.Holders, old.HolderCount, old.Slots, old.QueueLength, old.Lanes
		msg := "The backend did not answer; the holder shown is the last one observed"
		if obs.backendReason != locksv1alpha1.ReasonBackendUnreachable {
			msg = "The backend cannot be used (see the BackendReady condition); the holder shown is the last one observed"
		}
		set(locksv1alpha1.ConditionHeld, metav1.ConditionUnknown, locksv1alpha1.ReasonBackendUnavailable, msg)
		setManual(dl, obs, &st, set, metav1.ConditionUnknown, locksv1alpha1.ReasonBackendUnavailable, msg)
		return st
	}
	set(locksv1alpha1.ConditionBackendReady, metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, "The backend answers")
	if dl.Spec.KeyFrom != nil {
		lanesStatus(dl, obs, &st, set, cluster)
		return st
	}

	held := firstHeld(obs.states)
	if held != nil {
		h := holder.Decode(held.Holder).Shown()
		st.Holder = &locksv1alpha1.HolderStatus{Identity: h.Identity, Cluster: h.Cluster, Lock: h.Lock, Kind: h.Kind, Namespace: h.Namespace, Name: h.Name}
		st.FencingToken = held.Fence
		if old.Holder != nil && *old.Holder == *st.Holder && old.FencingToken == st.FencingToken && old.AcquiredTime != nil {
			st.AcquiredTime, st.ExpireTime = old.AcquiredTime, old.ExpireTime
		} else {
			acquired := apiTime(obs.now)
			if !held.Acquired.IsZero() {
				acquired = apiTime(held.Acquired)
			}
			expires := apiTime(held.Expires)
			st.AcquiredTime, st.ExpireTime = &acquired, &expires
		}
	}
	st.Waiting = waitingStatus(obs.states)
	var ours *locksv1alpha1.HolderStatus
	if len(obs.states) > 0 {
		k := obs.states[0]
		st.HolderCount = ptr.To(clampInt32(holderCount(k)))
		st.QueueLength = ptr.To(clampInt32(queueLength(k)))
		for _, hs := range holdersOf(k) {
			raw := holder.Decode(hs.Holder)
			h := raw.Shown()
			acquired := apiTime(hs.Acquired)
			e := locksv1alpha1.HolderStatus{Identity: h.Identity, Cluster: h.Cluster, Lock: h.Lock, Kind: h.Kind, Namespace: h.Namespace, Name: h.Name, FencingToken: hs.Fence}
			if hs.Weight > 1 {
				e.Weight = clampInt32(hs.Weight)
			}
			if !hs.Acquired.IsZero() {
				e.AcquiredTime = &acquired
			}
			if ours == nil && raw.Of(cluster, dl.Namespace, dl.Name) {
				ours = &e
			}
			if len(st.Holders) < maxHoldersInStatus {
				st.Holders = append(st.Holders, e)
			}
		}
	}
	taken := 0
	if len(obs.states) > 0 {
		taken = slotsTaken(obs.states[0])
	}
	st.Slots = fmt.Sprintf("%d/%d", taken, maxHolders(dl))
	setManual(dl, obs, &st, set, "", "", "")
	if !obs.cooldownUntil.IsZero() {
		// Of a semaphore, the slot that comes free last.
		until := apiTime(obs.cooldownUntil)
		st.CooldownUntil = &until
	}

	switch {
	case ours != nil && (held == nil || !holder.Decode(held.Holder).Of(cluster, dl.Namespace, dl.Name)):
		// A semaphore: one of this lock's holders holds a slot, an older
		// holder of another lock holds another.
		ttl := time.Duration(dl.Spec.TTLSeconds) * time.Second
		set(locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired,
			fmt.Sprintf("Held by %s with fencing token %d (%s slots taken); renewed every %v, the keys are freed at most %v after the holder stops",
				ours.Identity, ours.FencingToken, st.Slots, ttl/3, ttl))
	case held != nil && !obs.cooldownUntil.IsZero() && held.Holder == obs.cooldownHolder:
		until := apiTime(obs.cooldownUntil)
		st.ExpireTime = &until
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonCooldown,
			fmt.Sprintf("%s released the keys (fencing token %d); they stay held for spec.cooldownSeconds (%ds), until %s, and the next holder starts then",
				st.Holder.Identity, st.FencingToken, dl.Spec.CooldownSeconds, until.UTC().Format(time.RFC3339)))
	case held != nil && holder.Decode(held.Holder).Of(cluster, dl.Namespace, dl.Name):
		// This operator renews the lease: it has no fixed expiry, and a time
		// written here would be out of date after the first renewal.
		st.ExpireTime = nil
		ttl := time.Duration(dl.Spec.TTLSeconds) * time.Second
		set(locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired,
			fmt.Sprintf("Held by %s with fencing token %d; renewed every %v, the keys are freed at most %v after the holder stops",
				st.Holder.Identity, st.FencingToken, ttl/3, ttl))
	case obs.lost != nil:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonLost,
			fmt.Sprintf("The lease of %s (fencing token %d) was lost: %s", holder.Decode(obs.lost.Lease.Holder).Shown().Identity, obs.lost.Lease.Fence, backend.Describe(obs.lost.Err)))
	case held != nil && obs.waiting && obs.busy != nil:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("Waiting at %s; the keys are held by %s (fencing token %d)", waitingFor(obs.busy, nil), st.Holder.Identity, st.FencingToken))
	case held != nil && obs.waiting:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("Waiting: the keys are held by %s (fencing token %d)", st.Holder.Identity, st.FencingToken))
	case held != nil:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther,
			fmt.Sprintf("The keys are held by %s (fencing token %d), not through this lock%s", st.Holder.Identity, st.FencingToken, unconfirmed(held)))
	case obs.waiting:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("Waiting at %s, behind %d waiter(s)", waitingFor(obs.busy, nil), max(obs.busy.Position, 0)))
	default:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree, "No holder holds the keys")
	}
	return st
}

// unconfirmed is what the Held condition adds when the holder of held was
// seen on fewer Redlock nodes than its quorum while others did not answer.
func unconfirmed(held *lock.KeyState) string {
	if len(held.Holders) == 0 || !held.Holders[0].Unconfirmed {
		return ""
	}
	return "; seen on fewer Redis nodes than a majority while some did not answer, so it may hold them through those nodes"
}

// firstHeld returns the state of the first held key, or nil.
func firstHeld(states []lock.KeyState) *lock.KeyState {
	for i := range states {
		if states[i].Held {
			return &states[i]
		}
	}
	return nil
}

// waitingStatus lists the head of the first key's queue.
func waitingStatus(states []lock.KeyState) []locksv1alpha1.WaiterStatus {
	if len(states) == 0 || len(states[0].Waiters) == 0 {
		return nil
	}
	ws := states[0].Waiters
	if len(ws) > maxWaitingInStatus {
		ws = ws[:maxWaitingInStatus]
	}
	out := make([]locksv1alpha1.WaiterStatus, len(ws))
	for i, w := range ws {
		since := apiTime(w.Since)
		out[i] = locksv1alpha1.WaiterStatus{Identity: holder.Decode(w.Holder).Shown().Identity, Since: &since}
	}
	return out
}

// setManual sets the ManualHolderHeld condition: True only while spec.holder
// itself holds the keys. With a status and reason given (the backend cannot
// be used), a manual holder gets that; otherwise it is derived from obs.
func setManual(dl *locksv1alpha1.DistributedLock, obs *observation, st *locksv1alpha1.DistributedLockStatus,
	set func(t string, s metav1.ConditionStatus, reason, msg string), status metav1.ConditionStatus, reason, msg string) {
	const t = locksv1alpha1.ConditionManualHolderHeld
	spec := dl.Spec.Holder
	switch {
	case spec == nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonNoManualHolder, "spec.holder is not set")
	case obs.holdEndedShown:
		// Status says so already, with why (kept from before a restart).
	case obs.holdEnded != "":
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonHoldEnded,
			fmt.Sprintf("The hold of %s ended: %s; change spec.holder to hold again", spec.Identity, obs.holdEnded))
	case reason != "":
		if status == metav1.ConditionUnknown && obs.mine == nil {
			status = metav1.ConditionFalse
		}
		set(t, status, reason, msg)
	case obs.mine != nil:
		m := fmt.Sprintf("%s holds the keys with fencing token %d", spec.Identity, obs.mine.Fence)
		if !obs.holdEnds.IsZero() {
			m += fmt.Sprintf(" until %s", obs.holdEnds.UTC().Format(time.RFC3339))
		}
		set(t, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired, m)
	case obs.lost != nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonLost,
			fmt.Sprintf("The lease of %s was lost: %s", spec.Identity, backend.Describe(obs.lost.Err)))
	case obs.waiting && obs.busy != nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("%s waits: %s", spec.Identity, waitingFor(obs.busy, st)))
	default:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting, fmt.Sprintf("%s does not hold the keys yet", spec.Identity))
	}
}

// waitingFor says where a waiter stands: its position and whom it waits behind.
func waitingFor(busy *lock.HeldError, st *locksv1alpha1.DistributedLockStatus) string {
	pos := fmt.Sprintf("position %d of %d", max(busy.Position, 0)+1, max(busy.Waiters, busy.Position+1, 1))
	if busy.Position < 0 {
		// Replaced in the queue (ErrReplaced): it joins again shortly.
		pos = "no place in the queue yet"
	}
	switch {
	case busy.Holder != "":
		return fmt.Sprintf("%s, behind %s (fencing token %d)", pos, holder.Decode(busy.Holder).Shown().Identity, busy.Fence)
	case st != nil && st.Holder != nil:
		return fmt.Sprintf("%s, behind %s", pos, st.Holder.Identity)
	default:
		return pos
	}
}

// clampInt32 converts a count for status, saturating at the int32 range.
func clampInt32(n int) int32 {
	return int32(min(max(n, 0), math.MaxInt32))
}

// apiTime is t as the API server stores it: whole seconds. A status computed
// again from the same backend state then equals the stored one, and is not
// written again.
func apiTime(t time.Time) metav1.Time {
	return metav1.NewTime(t.Truncate(time.Second))
}

// lanesStatus fills the status of a lock that derives keys: counts and the
// busiest keys, never an entry per key, and Held when any of its keys is
// held through it.
func lanesStatus(dl *locksv1alpha1.DistributedLock, obs *observation, st *locksv1alpha1.DistributedLockStatus,
	set func(t string, s metav1.ConditionStatus, reason, msg string), cluster string) {
	lanes := &locksv1alpha1.LanesStatus{Keys: clampInt32(obs.lanes)}
	busiest := make([]locksv1alpha1.LaneStatus, 0, len(obs.states))
	heldHere := 0
	for _, s := range obs.states {
		key, _ := backend.LaneKey(dl, s.Key)
		l := locksv1alpha1.LaneStatus{Key: key, Holders: clampInt32(holderCount(s)), Waiting: clampInt32(queueLength(s))}
		for _, hs := range holdersOf(s) {
			l.FencingToken = max(l.FencingToken, hs.Fence)
			if holder.Decode(hs.Holder).Of(cluster, dl.Namespace, dl.Name) {
				heldHere++
			}
		}
		lanes.Holders += l.Holders
		lanes.Waiting += l.Waiting
		if l.Holders > 0 || l.Waiting > 0 {
			busiest = append(busiest, l)
		}
	}
	slices.SortFunc(busiest, func(a, b locksv1alpha1.LaneStatus) int {
		if c := cmp.Compare(b.Holders+b.Waiting, a.Holders+a.Waiting); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(busiest) > maxBusiestLanes {
		busiest = busiest[:maxBusiestLanes]
	}
	if len(busiest) > 0 {
		lanes.Busiest = busiest
	}
	st.Lanes = lanes
	switch {
	case heldHere > 0:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired,
			fmt.Sprintf("%d holder(s) of this lock hold %d derived key(s) in use; %d waiting (status.lanes)", heldHere, lanes.Keys, lanes.Waiting))
	case lanes.Holders > 0:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther,
			fmt.Sprintf("The %d derived key(s) in use are held, not through this lock; %d waiting", lanes.Keys, lanes.Waiting))
	default:
		set(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree, fmt.Sprintf("No holder holds the %d derived key(s) in use", lanes.Keys))
	}
}

// setHoldActive sets the HoldActive condition of a lock with spec.holds
// (removes it from one without): True only while a window is open and its
// hold holds the keys.
func setHoldActive(dl *locksv1alpha1.DistributedLock, obs *observation,
	set func(t string, s metav1.ConditionStatus, reason, msg string), st *locksv1alpha1.DistributedLockStatus) {
	const t = locksv1alpha1.ConditionHoldActive
	if len(dl.Spec.Holds) == 0 {
		meta.RemoveStatusCondition(&st.Conditions, t)
		return
	}
	open := obs.holds.open
	until := ""
	if open != nil {
		until = open.End.UTC().Format(time.RFC3339)
	}
	switch {
	case obs.holds.invalid != "" && open == nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonInvalidHold, obs.holds.invalid)
	case open == nil && obs.holds.next != nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonNoWindowOpen,
			fmt.Sprintf("No window is open; the next, of hold %s, opens at %s", obs.holds.next.name, obs.holds.next.Start.UTC().Format(time.RFC3339)))
	case open == nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonNoWindowOpen, "No window is open, and none opens again")
	case obs.holds.manualFirst:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonManualHolderFirst,
			fmt.Sprintf("The window of hold %s is open until %s, but spec.holder is set and holds instead", open.name, until))
	case obs.scopeDenied != "":
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed, obs.scopeDenied)
	case obs.mine != nil && isHold(obs.mine.Holder):
		set(t, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired,
			fmt.Sprintf("The window of hold %s is open until %s; hold/%s holds the keys with fencing token %d", open.name, until, open.name, obs.mine.Fence))
	case obs.backendErr != nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnavailable,
			fmt.Sprintf("The window of hold %s is open until %s, but the backend cannot be used (see BackendReady)", open.name, until))
	case obs.waiting && obs.busy != nil:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("The window of hold %s is open until %s; its hold waits at %s", open.name, until, waitingFor(obs.busy, st)))
	default:
		set(t, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting,
			fmt.Sprintf("The window of hold %s is open until %s; its hold does not hold the keys yet", open.name, until))
	}
}
