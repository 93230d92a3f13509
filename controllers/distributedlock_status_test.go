package controllers

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// The status a user sees (kubectl get/describe/wait) for what one reconcile
// observed: pure, no control plane or Redis.

var (
	statusNow = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

	manual = holder.Holder{Cluster: "prod", Namespace: "batch", Lock: "billing", Kind: lockKind, Name: "billing", UID: "u1", Identity: "maintenance"}
	// other is a holder that acquired the same keys through another lock.
	other = holder.Holder{Cluster: "prod", Namespace: "ops", Lock: "ledger", Kind: jobKind, Name: "compact-1", UID: "u2", Identity: "prod/ops/Job/compact-1/u2"}
)

func testLock() *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "billing", Generation: 3},
		Spec:       locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"}, TTLSeconds: 30},
	}
}

func heldState(h holder.Holder, fence int64) []lock.KeyState {
	return []lock.KeyState{{Key: "ledger", Held: true, Holder: h.Encode(), Fence: fence, Acquired: statusNow.Add(-time.Minute), Expires: statusNow.Add(20 * time.Second)}}
}

// cond is the part of a condition a user matches on.
type cond struct {
	Status metav1.ConditionStatus
	Reason string
}

func conditionOf(st locksv1alpha1.DistributedLockStatus, t string) *cond {
	c := meta.FindStatusCondition(st.Conditions, t)
	if c == nil {
		return nil
	}
	return &cond{c.Status, c.Reason}
}

func TestComputeStatusConditions(t *testing.T) {
	t.Parallel()
	lost := &watchdog.Lost{Lease: &lock.Lease{Holder: manual.Encode(), Fence: 7}, Err: lock.ErrLost}
	tests := map[string]struct {
		obs       observation
		wantHeld  *cond
		wantReady *cond
		wantFence int64
		wantWho   string
	}{
		"held by this lock's manual holder": {
			obs:       observation{states: heldState(manual, 42)},
			wantHeld:  &cond{metav1.ConditionTrue, locksv1alpha1.ReasonAcquired},
			wantReady: &cond{metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable},
			wantFence: 42, wantWho: "maintenance",
		},
		"held through another lock": {
			obs:       observation{states: heldState(other, 9)},
			wantHeld:  &cond{metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther},
			wantReady: &cond{metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable},
			wantFence: 9, wantWho: other.Identity,
		},
		"manual holder queued behind another": {
			obs:       observation{states: heldState(other, 9), waiting: true, busy: &lock.HeldError{Holder: other.Encode(), Fence: 9}},
			wantHeld:  &cond{metav1.ConditionFalse, locksv1alpha1.ReasonWaiting},
			wantReady: &cond{metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable},
			wantFence: 9, wantWho: other.Identity,
		},
		"free": {
			obs:       observation{states: []lock.KeyState{{Key: "ledger", Fence: 5}}},
			wantHeld:  &cond{metav1.ConditionFalse, locksv1alpha1.ReasonFree},
			wantReady: &cond{metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable},
		},
		"lease lost and keys free": {
			obs:       observation{states: []lock.KeyState{{Key: "ledger", Fence: 7}}, lost: lost},
			wantHeld:  &cond{metav1.ConditionFalse, locksv1alpha1.ReasonLost},
			wantReady: &cond{metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable},
		},
		"backend down": {
			obs:       observation{backendErr: errors.New("dial tcp: connection refused"), backendReason: locksv1alpha1.ReasonBackendUnreachable},
			wantHeld:  &cond{metav1.ConditionUnknown, locksv1alpha1.ReasonBackendUnavailable},
			wantReady: &cond{metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable},
		},
		"missing Secret": {
			obs:       observation{backendErr: errors.New("spec.backend.redis.passwordSecretRef: not found"), backendReason: locksv1alpha1.ReasonSecretNotFound},
			wantHeld:  &cond{metav1.ConditionUnknown, locksv1alpha1.ReasonBackendUnavailable},
			wantReady: &cond{metav1.ConditionFalse, locksv1alpha1.ReasonSecretNotFound},
		},
		"scope Global not allowed": {
			obs:      observation{scopeDenied: "spec.scope: Global is not allowed"},
			wantHeld: &cond{metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obs := tc.obs
			obs.now = statusNow
			dl := testLock()
			st := computeStatus(dl, &obs, "prod")
			if diff := cmp.Diff(tc.wantHeld, conditionOf(st, locksv1alpha1.ConditionHeld)); diff != "" {
				t.Errorf("Held condition (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantReady, conditionOf(st, locksv1alpha1.ConditionBackendReady)); diff != "" {
				t.Errorf("BackendReady condition (-want,+got):\n%s", diff)
			}
			if st.FencingToken != tc.wantFence {
				t.Errorf("fencingToken = %d, want %d", st.FencingToken, tc.wantFence)
			}
			who := ""
			if st.Holder != nil {
				who = st.Holder.Identity
			}
			if who != tc.wantWho {
				t.Errorf("holder = %q, want %q", who, tc.wantWho)
			}
			for _, c := range st.Conditions {
				if c.ObservedGeneration != dl.Generation {
					t.Errorf("condition %s has observedGeneration %d, want %d", c.Type, c.ObservedGeneration, dl.Generation)
				}
			}
		})
	}
}

// A holder Redlock could not confirm (some nodes did not answer) shows as
// holding the keys, and the Held condition says why it is not certain.
func TestComputeStatusUnconfirmedHolder(t *testing.T) {
	t.Parallel()
	states := heldState(other, 9)
	states[0].Holders = []lock.HolderState{{Holder: other.Encode(), Fence: 9, Unconfirmed: true}}
	obs := observation{states: states, now: statusNow}
	st := computeStatus(testLock(), &obs, "prod")
	c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionHeld)
	if c == nil || c.Reason != locksv1alpha1.ReasonHeldByOther || !strings.Contains(c.Message, "fewer Redis nodes than a majority") {
		t.Fatalf("Held condition %+v; want %s, saying the holder was seen on fewer nodes than a majority", c, locksv1alpha1.ReasonHeldByOther)
	}
	if st.Holder == nil || st.Holder.Identity != other.Identity || st.FencingToken != 9 {
		t.Fatalf("status holder %+v, token %d; want %s with token 9", st.Holder, st.FencingToken, other.Identity)
	}
}

// A renewal moves the expiry in Redis but must not change status: otherwise
// every renewal of every lease is a status write.
func TestComputeStatusUnchangedByRenewal(t *testing.T) {
	t.Parallel()
	dl := testLock()
	first := computeStatus(dl, &observation{now: statusNow, states: heldState(other, 9)}, "prod")
	dl.Status = first
	renewed := heldState(other, 9)
	renewed[0].Expires = renewed[0].Expires.Add(10 * time.Second)
	second := computeStatus(dl, &observation{now: statusNow.Add(10 * time.Second), states: renewed}, "prod")
	if diff := cmp.Diff(first, second); diff != "" {
		t.Fatalf("status changed by a renewal (-before,+after):\n%s", diff)
	}
}

// A lease this operator renews has no fixed expiry in status (it would be out
// of date after the first renewal); one held elsewhere shows when it expires.
func TestComputeStatusExpireTime(t *testing.T) {
	t.Parallel()
	mine := computeStatus(testLock(), &observation{now: statusNow, states: heldState(manual, 1)}, "prod")
	if mine.ExpireTime != nil {
		t.Errorf("expireTime = %v for a lease the operator renews, want none", mine.ExpireTime)
	}
	elsewhere := computeStatus(testLock(), &observation{now: statusNow, states: heldState(other, 1)}, "prod")
	if elsewhere.ExpireTime == nil || !elsewhere.ExpireTime.Time.Equal(statusNow.Add(20*time.Second)) {
		t.Errorf("expireTime = %v for a lease held elsewhere, want %v", elsewhere.ExpireTime, statusNow.Add(20*time.Second))
	}
}

// While the backend does not answer, status keeps the last holder it saw.
func TestComputeStatusKeepsLastHolderWhileBackendDown(t *testing.T) {
	t.Parallel()
	dl := testLock()
	dl.Status = computeStatus(dl, &observation{now: statusNow, states: heldState(other, 9)}, "prod")
	down := computeStatus(dl, &observation{now: statusNow, backendErr: errors.New("timeout"), backendReason: locksv1alpha1.ReasonBackendUnreachable}, "prod")
	if down.Holder == nil || down.Holder.Identity != other.Identity || down.FencingToken != 9 {
		t.Fatalf("holder %+v fence %d while the backend is down, want the last seen %s with 9", down.Holder, down.FencingToken, other.Identity)
	}
}

func TestWaitingStatusIsBounded(t *testing.T) {
	t.Parallel()
	ws := make([]lock.Waiter, maxWaitingInStatus+5)
	for i := range ws {
		ws[i] = lock.Waiter{Holder: holder.Holder{Identity: string(rune('a' + i))}.Encode(), Since: statusNow}
	}
	got := waitingStatus([]lock.KeyState{{Key: "ledger", Waiters: ws}})
	if len(got) != maxWaitingInStatus || got[0].Identity != "a" {
		t.Fatalf("status.waiting has %d entries starting with %q, want the first %d starting with a", len(got), got[0].Identity, maxWaitingInStatus)
	}
}

// A status read back from the API server (times in whole seconds) and
// computed again from the same backend state is the same status: a
// reconcile of a lock whose backend did not change writes nothing.
func TestComputeStatusStableAcrossTheAPIServer(t *testing.T) {
	t.Parallel()
	dl := testLock()
	dl.Spec.MaxHolders = 3
	states := []lock.KeyState{{
		Key: "ledger", Held: true, Holder: other.Encode(), Fence: 9,
		Acquired: statusNow.Add(-time.Minute + 123456*time.Microsecond), Expires: statusNow.Add(20*time.Second + 654321*time.Microsecond),
		Holders: []lock.HolderState{
			{Holder: other.Encode(), Fence: 9, Acquired: statusNow.Add(-time.Minute + 123456*time.Microsecond)},
			{Holder: manual.Encode(), Fence: 11, Acquired: statusNow.Add(-time.Second + 987*time.Microsecond)},
		},
		HolderCount: 2,
		Waiters:     []lock.Waiter{{Holder: "prod/batch/Job/next/u3", Since: statusNow.Add(-500 * time.Millisecond)}},
		Queued:      1,
	}}
	first := computeStatus(dl, &observation{now: statusNow.Add(250 * time.Millisecond), states: states}, "prod")
	b, err := json.Marshal(first)
	if err != nil {
		t.Fatal(err)
	}
	var stored locksv1alpha1.DistributedLockStatus
	if err := json.Unmarshal(b, &stored); err != nil {
		t.Fatal(err)
	}
	dl.Status = stored
	again := computeStatus(dl, &observation{now: statusNow.Add(30 * time.Second), states: states}, "prod")
	if !equality.Semantic.DeepEqual(stored, again) {
		t.Fatalf("status computed again from the same state differs from the stored one (-stored,+again):\n%s", cmp.Diff(stored, again))
	}
}

// A tenant who owns the backend can write any holder string there. What
// status shows of it (and so what kubectl prints to an administrator) has
// no control characters, line breaks or bidi overrides, and is bounded.
func TestComputeStatusEscapesWhatTheStoreWrote(t *testing.T) {
	t.Parallel()
	forged := holder.Holder{
		Cluster: "prod\x1b[2K", Namespace: "ops\nbilling", Lock: "ledger\t", Kind: "Job\u202e", Name: "compact\r",
		UID: "u9", Identity: "x\nbilling   payments-prod   ledger   nobody\x1b[2K\u202egnp.exe\x00" + strings.Repeat("y", 5000),
	}
	waiter := holder.Holder{Identity: "next\n\x1b]0;owned\x07" + strings.Repeat("z", 5000)}.Encode()
	dl := testLock()
	dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	states := heldState(forged, 9)
	states[0].Holders = []lock.HolderState{{Holder: forged.Encode(), Fence: 9, Acquired: statusNow}}
	states[0].HolderCount = 1
	states[0].Waiters = []lock.Waiter{{Holder: waiter, Since: statusNow}}
	st := computeStatus(dl, &observation{now: statusNow, states: states, waiting: true, busy: &lock.HeldError{Holder: forged.Encode(), Fence: 9}}, "prod")

	if st.Holder == nil || len(st.Holders) != 1 || len(st.Waiting) != 1 {
		t.Fatalf("status shows holder %v, %d holders, %d waiters; want the forged holder and the waiter", st.Holder, len(st.Holders), len(st.Waiting))
	}
	texts := map[string]string{"status.waiting[0].identity": st.Waiting[0].Identity}
	for name, h := range map[string]locksv1alpha1.HolderStatus{"status.holder": *st.Holder, "status.holders[0]": st.Holders[0]} {
		for field, v := range map[string]string{"identity": h.Identity, "cluster": h.Cluster, "namespace": h.Namespace, "lock": h.Lock, "kind": h.Kind, "name": h.Name} {
			texts[name+"."+field] = v
		}
	}
	for _, c := range st.Conditions {
		texts["condition "+c.Type] = c.Message
	}
	for field, v := range texts {
		for _, r := range v {
			if !unicode.IsPrint(r) {
				t.Errorf("%s = %.80q... holds the unprintable %U", field, v, r)
				break
			}
		}
	}
	if got := st.Holder.Identity; !strings.HasPrefix(got, `x\nbilling   payments-prod   ledger   nobody\x1b[2K\u202egnp.exe\x00yyy`) {
		t.Errorf("status.holder.identity = %.120q..., want the store's text with its unprintable characters escaped", got)
	}
	for field, v := range map[string]string{"status.holder.identity": st.Holder.Identity, "status.holders[0].identity": st.Holders[0].Identity, "status.waiting[0].identity": st.Waiting[0].Identity} {
		if n := utf8.RuneCountInString(v); n > holder.MaxShownIdentity {
			t.Errorf("%s has %d characters, want at most %d (the CRD's maxLength)", field, n, holder.MaxShownIdentity)
		}
	}
}
