package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A running Job keeps its lease for as long as the watchdog renews it;
// when the lease expires in the store unrenewed (and another holder takes
// the keys), the Job is told, with the lock's onLost applied: Ignore lets
// it run on, Terminate stops its pods. It never releases the new holder's
// lease.
func TestRunningJobThatLostItsLeaseIsToldAndStoppedPerOnLost(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		onLost        locksv1alpha1.OnLost
		wantSuspended bool
		wantEvents    func(lock string, fence int64) []string // reasons Lost and Terminated, on the Job
	}{
		"onLost Ignore: it runs on": {
			onLost: locksv1alpha1.OnLostIgnore,
			wantEvents: func(lock string, fence int64) []string {
				return []string{fmt.Sprintf("Warning Lost Lost the lease of lock %s (fencing token %d)", lock, fence)}
			},
		},
		"onLost Terminate: its pods are stopped": {
			onLost:        locksv1alpha1.OnLostTerminate,
			wantSuspended: true,
			wantEvents: func(lock string, fence int64) []string {
				return []string{
					fmt.Sprintf("Warning Lost Lost the lease of lock %s (fencing token %d)", lock, fence),
					"Warning Terminated Stopped the Job's pods: its lease was lost and the lock's onLost is Terminate",
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newUnitEnv(t)
			dl := unitLock(unitLockName)
			dl.Spec.OnLost = tc.onLost
			e.createLock(dl)
			e.submitJob("ledger", unitLockName)
			e.reconcileJob("ledger")
			fence := e.jobFence(e.job("ledger"))

			// Renewed every third of the TTL, the lease outlives it many times.
			for range 12 {
				e.clock.Step(unitTTL / 3)
				e.dog.RenewDue(e.ctx)
			}
			if got := requested(e.jobs.tracker); len(got) > 0 {
				l, _ := e.jobs.lostOf(types.NamespacedName{Namespace: unitNS, Name: "ledger"})
				t.Fatalf("a renewed lease was reported lost (%v): reconciles of %v were asked for", l.Err, got)
			}
			e.reconcileJob("ledger")
			if j := e.job("ledger"); suspended(j) || j.Annotations[locksv1alpha1.AnnotationLost] != "" {
				t.Fatalf("the renewed Job was stopped or marked lost: suspend=%v lost=%q", suspended(j), j.Annotations[locksv1alpha1.AnnotationLost])
			}
			if s := e.storeState(unitLockName); s.Holder != jobHolder(e.job("ledger")).Encode() || s.Fence != fence {
				t.Fatalf("after %v of renewals the store shows holder %q with token %d", 12*unitTTL/3, s.Holder, s.Fence)
			}

			// Renewals stop (the backend did not answer) for a whole TTL;
			// the lease expires and another cluster takes the keys.
			e.clock.Step(unitTTL + time.Second)
			thief := otherHolder("compact")
			theirs := e.takeKeys(e.otherLocker(), unitLockName, thief)
			if theirs.Fence <= fence {
				t.Fatalf("the new holder got token %d, not larger than the lost lease's %d", theirs.Fence, fence)
			}
			e.dog.RenewDue(e.ctx) // finds the lease expired
			if diff := cmp.Diff([]string{"ledger"}, requested(e.jobs.tracker)); diff != "" {
				t.Fatalf("the loss asks for a reconcile of the Job (-want,+got):\n%s", diff)
			}
			e.reconcileJob("ledger")

			j := e.job("ledger")
			if suspended(j) != tc.wantSuspended {
				t.Errorf("after the loss the Job is suspended=%v, want %v (onLost %s)", suspended(j), tc.wantSuspended, tc.onLost)
			}
			lost := j.Annotations[locksv1alpha1.AnnotationLost]
			if !strings.HasPrefix(lost, e.clock.Now().UTC().Format(time.RFC3339)+": ") {
				t.Errorf("annotation %s = %q, want when and why the lease was lost", locksv1alpha1.AnnotationLost, lost)
			}
			if got := e.jobFence(j); got != fence {
				t.Errorf("the Job's fencing token changed from %d to %d on the loss", fence, got)
			}
			var gotEvents []string
			for _, reason := range []string{locksv1alpha1.EventLost, locksv1alpha1.EventTerminated} {
				for _, ev := range e.events.on("Job/ledger", reason) {
					gotEvents = append(gotEvents, withoutCause(ev))
				}
			}
			if diff := cmp.Diff(tc.wantEvents(unitLockName, fence), gotEvents); diff != "" {
				t.Errorf("Events on the Job (-want,+got):\n%s", diff)
			}

			// Finishing the Job that lost its lease leaves the new holder alone.
			e.finishJob("ledger")
			e.reconcileJob("ledger")
			if s := e.storeState(unitLockName); s.Holder != thief.Encode() || s.Fence != theirs.Fence {
				t.Fatalf("the store shows holder %q with token %d, want the other cluster's Job with token %d", s.Holder, s.Fence, theirs.Fence)
			}
			e.reconcileLock(unitLockName)
			st := e.lock(unitLockName).Status
			if c := findCondition(e.lock(unitLockName), locksv1alpha1.ConditionHeld); c == nil || c.Status != metav1.ConditionFalse || c.Reason != locksv1alpha1.ReasonHeldByOther {
				t.Errorf("lock Held condition = %+v, want False %s", c, locksv1alpha1.ReasonHeldByOther)
			}
			if st.Holder == nil || st.Holder.Identity != thief.Identity || st.FencingToken != theirs.Fence {
				t.Errorf("lock status shows holder %+v with token %d, want %s with token %d", st.Holder, st.FencingToken, thief.Identity, theirs.Fence)
			}
		})
	}
}

// withoutCause keeps the part of a Lost Event a user matches on: the
// cause after the fencing token is worded by the store.
func withoutCause(ev string) string {
	if before, _, ok := strings.Cut(ev, "): "); ok {
		return before + ")"
	}
	return ev
}

// A lock's manual holder whose lease expired unrenewed is shown as Lost on
// the lock (Held and ManualHolderHeld, and a Lost Event); then it waits in
// the queue again behind whoever took the keys.
func TestManualHolderThatLostItsLeaseIsShownLostThenWaits(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	e.createLock(dl)
	e.reconcileLock(unitLockName)
	fence := e.lock(unitLockName).Status.FencingToken
	type shown struct {
		Held, Manual string // status and reason
		Holder       string
		Fence        int64
	}
	show := func() shown {
		dl := e.lock(unitLockName)
		held, manual := findCondition(dl, locksv1alpha1.ConditionHeld), findCondition(dl, locksv1alpha1.ConditionManualHolderHeld)
		s := shown{Held: string(held.Status) + " " + held.Reason, Manual: string(manual.Status) + " " + manual.Reason, Fence: dl.Status.FencingToken}
		if dl.Status.Holder != nil {
			s.Holder = dl.Status.Holder.Identity
		}
		return s
	}
	if diff := cmp.Diff(shown{Held: "True Acquired", Manual: "True Acquired", Holder: "maintenance", Fence: fence}, show()); diff != "" {
		t.Fatalf("the lock held by its manual holder (-want,+got):\n%s", diff)
	}

	requested(e.locks.tracker)          // drop the requests of the acquisition
	e.clock.Step(unitTTL + time.Second) // no renewal for a whole TTL
	thief := otherHolder("compact")
	theirs := e.takeKeys(e.otherLocker(), unitLockName, thief)
	e.dog.RenewDue(e.ctx)
	if diff := cmp.Diff([]string{unitLockName}, requested(e.locks.tracker)); diff != "" {
		t.Fatalf("the loss asks for a reconcile of the lock (-want,+got):\n%s", diff)
	}
	e.reconcileLock(unitLockName)
	if diff := cmp.Diff(shown{Held: "False Lost", Manual: "False Lost", Holder: thief.Identity, Fence: theirs.Fence}, show()); diff != "" {
		t.Errorf("the lock right after the loss (-want,+got):\n%s", diff)
	}
	lostEvents := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventLost)
	if want := fmt.Sprintf("Warning Lost Lost the lease of maintenance (fencing token %d): ", fence); len(lostEvents) != 1 || !strings.HasPrefix(lostEvents[0], want) {
		t.Errorf("Lost Events on the lock = %q, want one starting %q", lostEvents, want)
	}

	e.reconcileLock(unitLockName)
	if diff := cmp.Diff(shown{Held: "False Waiting", Manual: "False Waiting", Holder: thief.Identity, Fence: theirs.Fence}, show()); diff != "" {
		t.Errorf("the lock once the loss was shown (-want,+got):\n%s", diff)
	}
	if got := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventLost); len(got) != 1 {
		t.Errorf("the loss was reported %d times, want once: %q", len(got), got)
	}
}

// A lease whose renewals got no answer for its whole validity is lost for
// the operator, even though the store ran those renewals and still holds
// the keys for it: the operator could not know, and a lost lease is never
// taken back behind the holder's back.
func TestRunningJobIsToldLostWhenTheStoreDidNotAnswerForItsValidity(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(unitLock(unitLockName))
	e.submitJob("ledger", unitLockName)
	e.reconcileJob("ledger")
	fence := e.jobFence(e.job("ledger"))

	e.store.DropReplies() // the store runs the renewals; their answers are lost
	for range 4 {
		e.clock.Step(unitTTL / 3)
		e.dog.RenewDue(e.ctx)
	}
	e.store.DeliverReplies()
	if s := e.storeState(unitLockName); s.Holder != jobHolder(e.job("ledger")).Encode() || s.Fence != fence {
		t.Fatalf("the store shows holder %q with token %d, want the Job's lease, renewed by the unanswered calls", s.Holder, s.Fence)
	}
	if diff := cmp.Diff([]string{"ledger"}, requested(e.jobs.tracker)); diff != "" {
		t.Fatalf("the loss asks for a reconcile of the Job (-want,+got):\n%s", diff)
	}
	e.reconcileJob("ledger")
	j := e.job("ledger")
	if j.Annotations[locksv1alpha1.AnnotationLost] == "" {
		t.Fatalf("the Job is not marked lost: annotations %v", j.Annotations)
	}
	want := []string{fmt.Sprintf("Warning Lost Lost the lease of lock %s (fencing token %d)", unitLockName, fence)}
	var got []string
	for _, ev := range e.events.on("Job/ledger", locksv1alpha1.EventLost) {
		got = append(got, withoutCause(ev))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Lost Events on the Job (-want,+got):\n%s", diff)
	}
}
