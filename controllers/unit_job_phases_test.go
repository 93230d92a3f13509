package controllers

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// A gated Job waits suspended, showing whom it waits behind, for as long
// as another holder holds its lock's keys, and starts with a larger fencing
// token when that holder lets go.
func TestGatedJobWaitsSuspendedThenStartsWithALargerToken(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		// hold makes someone else hold the keys and returns its identity,
		// its fencing token and how it lets go.
		hold func(e *unitEnv) (identity string, fence int64, release func())
	}{
		"a Job of another cluster on the same store": {
			hold: func(e *unitEnv) (string, int64, func()) {
				other, h := e.otherLocker(), otherHolder("nightly-7")
				lease := e.takeKeys(other, unitLockName, h)
				return h.Identity, lease.Fence, func() {
					if err := other.Release(e.ctx, lease); err != nil {
						e.t.Fatal(err)
					}
				}
			},
		},
		"the lock's manual holder": {
			hold: func(e *unitEnv) (string, int64, func()) {
				e.updateLock(unitLockName, func(dl *locksv1alpha1.DistributedLock) {
					dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
				})
				e.reconcileLock(unitLockName)
				dl := e.lock(unitLockName)
				if c := findCondition(dl, locksv1alpha1.ConditionManualHolderHeld); c == nil || c.Reason != locksv1alpha1.ReasonAcquired {
					e.t.Fatalf("the manual holder does not hold the lock: %+v", c)
				}
				return "maintenance", dl.Status.FencingToken, func() {
					e.updateLock(unitLockName, func(dl *locksv1alpha1.DistributedLock) { dl.Spec.Holder = nil })
					e.reconcileLock(unitLockName)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newUnitEnv(t)
			e.createLock(unitLock(unitLockName))
			who, prev, release := tc.hold(e)

			e.submitJob("migrate", unitLockName)
			res := e.reconcileJob("migrate")
			// It waits, at every attempt, for as long as the holder holds.
			for range 3 {
				j := e.job("migrate")
				if !suspended(j) || e.jobFence(j) != 0 {
					t.Fatalf("the Job runs (suspend=%v, token %d) while %s holds its lock", ptr.Deref(j.Spec.Suspend, false), e.jobFence(j), who)
				}
				wantWait := map[string]string{
					locksv1alpha1.AnnotationQueuePosition: "1/1",
					locksv1alpha1.AnnotationWaitingFor:    fmt.Sprintf("held by %s (fencing token %d)", who, prev),
				}
				gotWait := map[string]string{
					locksv1alpha1.AnnotationQueuePosition: j.Annotations[locksv1alpha1.AnnotationQueuePosition],
					locksv1alpha1.AnnotationWaitingFor:    j.Annotations[locksv1alpha1.AnnotationWaitingFor],
				}
				if diff := cmp.Diff(wantWait, gotWait); diff != "" {
					t.Fatalf("the waiting Job's annotations (-want,+got):\n%s", diff)
				}
				if res.RequeueAfter <= 0 {
					t.Fatalf("a waiting Job is not looked at again (result %+v)", res)
				}
				e.clock.Step(res.RequeueAfter)
				res = e.reconcileJob("migrate")
			}
			wantWaiting := []string{fmt.Sprintf("Normal Waiting Waiting for lock %s: position 1 of 1, behind %s (fencing token %d)", unitLockName, who, prev)}
			if diff := cmp.Diff(wantWaiting, e.events.on("Job/migrate", locksv1alpha1.EventWaiting)); diff != "" {
				t.Errorf("Waiting Events on the Job, one per place it held (-want,+got):\n%s", diff)
			}

			release()
			e.reconcileJob("migrate")
			j := e.job("migrate")
			if suspended(j) {
				t.Fatal("the Job stays suspended after the holder released the lock")
			}
			got := e.jobFence(j)
			if got <= prev {
				t.Fatalf("the Job started with fencing token %d, not larger than the previous holder's %d", got, prev)
			}
			wantIdentity := holder.WorkloadIdentity(unitCluster, unitNS, jobKind, "migrate", string(j.UID))
			if h := j.Spec.Template.Annotations[locksv1alpha1.AnnotationHolder]; h != wantIdentity {
				t.Errorf("its pods get holder %q, want %q", h, wantIdentity)
			}
			for _, k := range []string{locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor} {
				if v, ok := j.Annotations[k]; ok {
					t.Errorf("the running Job still shows %s=%q", k, v)
				}
			}
			if diff := cmp.Diff([]string{fmt.Sprintf("Normal Acquired Acquired lock %s with fencing token %d; started", unitLockName, got)},
				e.events.on("Job/migrate", locksv1alpha1.EventAcquired)); diff != "" {
				t.Errorf("Acquired Event on the Job (-want,+got):\n%s", diff)
			}
			onLock := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventAcquired)
			if want := fmt.Sprintf("Normal Acquired Acquired by Job migrate with fencing token %d", got); !slices.Contains(onLock, want) {
				t.Errorf("the lock's Acquired Events %q lack %q", onLock, want)
			}
		})
	}
}

// Waiting Jobs show their place in the FIFO queue ("position/length") and
// whom they wait behind; when the holder finishes, only the head of the
// queue starts, whatever order their reconciles come in, and the others
// move up.
func TestQueueShowsEachWaitingJobItsPlaceAndTheHeadStartsFirst(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(unitLock(unitLockName))
	e.submitJob("holder", unitLockName)
	e.reconcileJob("holder")
	h := e.job("holder")
	first := e.jobFence(h)
	heldBy := fmt.Sprintf("held by %s (fencing token %d)", h.Annotations[locksv1alpha1.AnnotationHolder], first)

	waiters := []string{"w1", "w2", "w3"}
	for _, n := range waiters {
		e.submitJob(n, unitLockName)
		e.reconcileJob(n)
		e.clock.Step(time.Second)
	}
	for _, n := range waiters {
		e.reconcileJob(n) // the periodic attempt, which keeps its place
	}
	type shown struct{ Suspended, Position, WaitingFor string }
	show := func(names ...string) map[string]shown {
		out := map[string]shown{}
		for _, n := range names {
			j := e.job(n)
			out[n] = shown{fmt.Sprint(suspended(j)), j.Annotations[locksv1alpha1.AnnotationQueuePosition], j.Annotations[locksv1alpha1.AnnotationWaitingFor]}
		}
		return out
	}
	want := map[string]shown{
		"w1": {"true", "1/3", heldBy},
		"w2": {"true", "2/3", heldBy + ", 1 waiter(s) ahead"},
		"w3": {"true", "3/3", heldBy + ", 2 waiter(s) ahead"},
	}
	if diff := cmp.Diff(want, show(waiters...)); diff != "" {
		t.Fatalf("the waiting Jobs (-want,+got):\n%s", diff)
	}
	e.reconcileLock(unitLockName)
	var inStatus []string
	for _, w := range e.lock(unitLockName).Status.Waiting {
		inStatus = append(inStatus, w.Identity)
	}
	var wantStatus []string
	for _, n := range waiters {
		wantStatus = append(wantStatus, jobHolder(e.job(n)).Identity)
	}
	if diff := cmp.Diff(wantStatus, inStatus); diff != "" {
		t.Errorf("the lock's status.waiting, oldest first (-want,+got):\n%s", diff)
	}

	// The holder finishes. The tail's reconciles come first: they go on
	// waiting, behind the head.
	e.finishJob("holder")
	e.reconcileJob("holder")
	e.reconcileJob("w3")
	e.reconcileJob("w2")
	want = map[string]shown{
		"w2": {"true", "2/3", "1 waiter(s) ahead"},
		"w3": {"true", "3/3", "2 waiter(s) ahead"},
	}
	if diff := cmp.Diff(want, show("w2", "w3")); diff != "" {
		t.Fatalf("the waiters behind the head, once the holder released (-want,+got):\n%s", diff)
	}
	e.reconcileJob("w1")
	w1 := e.job("w1")
	if suspended(w1) {
		t.Fatal("the head of the queue did not start once the lock was free")
	}
	if f := e.jobFence(w1); f <= first {
		t.Fatalf("w1 started with fencing token %d, not larger than the previous holder's %d", f, first)
	}
	e.reconcileJob("w2")
	e.reconcileJob("w3")
	w1HeldBy := fmt.Sprintf("held by %s (fencing token %d)", w1.Annotations[locksv1alpha1.AnnotationHolder], e.jobFence(w1))
	want = map[string]shown{
		"w2": {"true", "1/2", w1HeldBy},
		"w3": {"true", "2/2", w1HeldBy + ", 1 waiter(s) ahead"},
	}
	if diff := cmp.Diff(want, show("w2", "w3")); diff != "" {
		t.Fatalf("the waiters after the head started (-want,+got):\n%s", diff)
	}
	// One Waiting Event per place w2 held, not one per attempt.
	wantEvents := []string{
		"Normal Waiting Waiting for lock billing: position 2 of 2, behind " + describeHolder(h.Annotations[locksv1alpha1.AnnotationHolder], first),
		"Normal Waiting Waiting for lock billing: position 2 of 3, behind " + describeHolder(h.Annotations[locksv1alpha1.AnnotationHolder], first),
		"Normal Waiting Waiting for lock billing: position 1 of 2, behind " + describeHolder(w1.Annotations[locksv1alpha1.AnnotationHolder], e.jobFence(w1)),
	}
	if diff := cmp.Diff(wantEvents, e.events.on("Job/w2", locksv1alpha1.EventWaiting)); diff != "" {
		t.Errorf("w2's Waiting Events (-want,+got):\n%s", diff)
	}
}

// A waiter keeps its place only while it calls again within the store's
// waiter TTL: the gated Jobs, which try again at every requeue, keep theirs
// however long they wait; a waiter of another cluster that stopped calling
// is dropped, and the Jobs behind it move up.
func TestWaitingJobsKeepTheirPlaceWhileAStoppedWaiterIsDropped(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(unitLock(unitLockName))
	e.submitJob("holder", unitLockName)
	e.reconcileJob("holder")

	// A waiter of another cluster joins the queue first, then goes away
	// without leaving it (its operator stopped).
	gone := otherHolder("stopped")
	_, err := e.otherLocker().TryAcquire(e.ctx, lock.Request{Keys: backend.EngineKeys(e.lock(unitLockName)), TTL: unitTTL, Owner: "owner-of-stopped", Holder: gone.Encode(), Queue: true})
	if busy := (*lock.HeldError)(nil); !errors.As(err, &busy) {
		t.Fatalf("the other cluster's waiter was not queued: %v", err)
	}
	e.submitJob("w1", unitLockName)
	e.submitJob("w2", unitLockName)
	next := map[string]time.Time{}
	for _, n := range []string{"w1", "w2", "w1"} {
		res := e.reconcileJob(n)
		next[n] = e.clock.Now().Add(res.RequeueAfter)
	}
	positions := func() []string {
		return []string{e.job("w1").Annotations[locksv1alpha1.AnnotationQueuePosition], e.job("w2").Annotations[locksv1alpha1.AnnotationQueuePosition]}
	}
	if diff := cmp.Diff([]string{"2/3", "3/3"}, positions()); diff != "" {
		t.Fatalf("positions of w1 and w2 behind the other cluster's waiter (-want,+got):\n%s", diff)
	}

	// Four waiter TTLs go by; the Jobs are reconciled when their requeue
	// comes, and the holder's lease is renewed by the watchdog.
	end := e.clock.Now().Add(4 * lock.DefaultWaiterTTL)
	for e.clock.Now().Before(end) {
		e.clock.Step(time.Second)
		e.dog.RenewDue(e.ctx)
		for _, n := range []string{"w1", "w2"} {
			if !e.clock.Now().Before(next[n]) {
				res := e.reconcileJob(n)
				next[n] = e.clock.Now().Add(res.RequeueAfter)
			}
		}
	}
	if diff := cmp.Diff([]string{"1/2", "2/2"}, positions()); diff != "" {
		t.Fatalf("positions of w1 and w2 once the stopped waiter was dropped (-want,+got):\n%s", diff)
	}
	if suspended(e.job("holder")) || !suspended(e.job("w1")) || !suspended(e.job("w2")) {
		t.Fatal("the holder must run on, renewed, and the waiters wait")
	}
	e.finishJob("holder")
	e.reconcileJob("holder")
	e.reconcileJob("w2")
	e.reconcileJob("w1")
	if suspended(e.job("w1")) || !suspended(e.job("w2")) {
		t.Fatalf("after the holder finished, w1 (the head) must run and w2 wait: w1 suspended=%v, w2 suspended=%v", suspended(e.job("w1")), suspended(e.job("w2")))
	}
}
