package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// When the holding Job finishes, its lease is released (once its pods have
// stopped) and the next waiter starts with a larger fencing token, at its
// next reconcile: not a TTL later.
func TestFinishedJobHandsTheLockToTheNextWaiter(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		// podsRun are the holder's pods still running when it is marked
		// complete; they stop at its next look.
		podsRun []string
	}{
		"its pods stopped":   {},
		"a pod still runs":   {podsRun: []string{"first-x7k2p"}},
		"two pods still run": {podsRun: []string{"first-a", "first-b"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newUnitEnv(t)
			e.createLock(unitLock(unitLockName))
			e.submitJob("first", unitLockName)
			e.reconcileJob("first")
			first := e.job("first")
			f1 := e.jobFence(first)
			e.submitJob("second", unitLockName)
			e.reconcileJob("second")

			e.pods.set(first.UID, tc.podsRun...)
			e.finishJob("first")
			res := e.reconcileJob("first")
			if len(tc.podsRun) > 0 {
				// The lock stays held while a pod of the finished Job may run.
				e.reconcileJob("second")
				if !suspended(e.job("second")) {
					t.Fatal("the next Job started while a pod of the previous holder still ran")
				}
				waits := e.events.on("Job/first", locksv1alpha1.EventReleaseWaitsForPods)
				want := fmt.Sprintf("Normal ReleaseWaitsForPods The Job was finished; lock %s (fencing token %d) stays held until its pods stop: %s",
					unitLockName, f1, joinNames(tc.podsRun))
				if diff := cmp.Diff([]string{want}, waits); diff != "" {
					t.Fatalf("ReleaseWaitsForPods Events on the finished Job (-want,+got):\n%s", diff)
				}
				if res.RequeueAfter <= 0 {
					t.Fatalf("the finished Job is not looked at again while its pods run (result %+v)", res)
				}
				e.pods.set(first.UID)
				e.clock.Step(res.RequeueAfter)
				e.reconcileJob("first")
			}
			if got := e.job("first"); slices.Contains(got.Finalizers, locksv1alpha1.Finalizer) {
				t.Errorf("the finished Job keeps the finalizer %s after its release", locksv1alpha1.Finalizer)
			}
			wantReleased := map[string][]string{
				"Job/first":                       {fmt.Sprintf("Normal Released Released lock %s (fencing token %d)", unitLockName, f1)},
				"DistributedLock/" + unitLockName: {fmt.Sprintf("Normal Released Released by Job first (fencing token %d)", f1)},
			}
			gotReleased := map[string][]string{}
			for obj := range wantReleased {
				gotReleased[obj] = e.events.on(obj, locksv1alpha1.EventReleased)
			}
			if diff := cmp.Diff(wantReleased, gotReleased); diff != "" {
				t.Errorf("Released Events (-want,+got):\n%s", diff)
			}

			// No clock step: the next Job starts at once, not when a TTL ran out.
			e.reconcileJob("second")
			second := e.job("second")
			if suspended(second) {
				t.Fatal("the next waiter did not start once the holder released the lock")
			}
			if f2 := e.jobFence(second); f2 <= f1 {
				t.Fatalf("the next Job got fencing token %d, not larger than the previous holder's %d", f2, f1)
			}
			// The store agrees: the second Job holds the keys with that token.
			states := e.storeState(unitLockName)
			if !states.Held || states.Fence != e.jobFence(second) || states.Holder != jobHolder(second).Encode() {
				t.Fatalf("the store shows holder %q with token %d, want the second Job with token %d", states.Holder, states.Fence, e.jobFence(second))
			}
		})
	}
}

// joinNames is how a ReleaseWaitsForPods Event lists pods.
func joinNames(names []string) string { return strings.Join(slices.Sorted(slices.Values(names)), ", ") }
