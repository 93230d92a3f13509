package controllers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// lockShown is what kubectl get/describe shows of a DistributedLock.
type lockShown struct {
	Held, ManualHolderHeld string // condition status and reason
	// Holder is status.holder: cluster/Kind/name, and identity.
	Holder, Identity string
	Fence            int64
	Waiting          []string
	QueueLength      int32
	Slots            string
}

func showLock(dl *locksv1alpha1.DistributedLock) lockShown {
	st := dl.Status
	s := lockShown{Fence: st.FencingToken, QueueLength: ptr.Deref(st.QueueLength, -1), Slots: st.Slots}
	if c := findCondition(dl, locksv1alpha1.ConditionHeld); c != nil {
		s.Held = string(c.Status) + " " + c.Reason
	}
	if c := findCondition(dl, locksv1alpha1.ConditionManualHolderHeld); c != nil {
		s.ManualHolderHeld = string(c.Status) + " " + c.Reason
	}
	if h := st.Holder; h != nil {
		s.Holder, s.Identity = h.Cluster+"/"+h.Kind+"/"+h.Name, h.Identity
	}
	for _, w := range st.Waiting {
		s.Waiting = append(s.Waiting, w.Identity)
	}
	return s
}

// A DistributedLock's status shows what the store holds for its keys: who
// holds them (one of its Jobs, its manual holder, or someone that did not
// acquire through it), with which fencing token, and who waits, in order.
func TestLockStatusShowsWhoHoldsTheKeysInTheStore(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		// arrange brings the store and the cluster to the case and returns
		// what the lock's status must show.
		arrange func(e *unitEnv) lockShown
	}{
		"nobody holds the keys": {
			arrange: func(*unitEnv) lockShown {
				return lockShown{Held: "False Free", ManualHolderHeld: "False NoManualHolder", Slots: "0/1"}
			},
		},
		"one of its Jobs holds them, two wait": {
			arrange: func(e *unitEnv) lockShown {
				for _, n := range []string{"a", "b", "c"} {
					e.submitJob(n, unitLockName)
					e.reconcileJob(n)
				}
				a := e.job("a")
				return lockShown{Held: "True Acquired", ManualHolderHeld: "False NoManualHolder",
					Holder: unitCluster + "/Job/a", Identity: jobHolder(a).Identity, Fence: e.jobFence(a),
					Waiting:     []string{jobHolder(e.job("b")).Identity, jobHolder(e.job("c")).Identity},
					QueueLength: 2, Slots: "1/1"}
			},
		},
		"its Job finished and released them": {
			arrange: func(e *unitEnv) lockShown {
				e.submitJob("a", unitLockName)
				e.reconcileJob("a")
				e.reconcileLock(unitLockName)
				e.finishJob("a")
				e.reconcileJob("a")
				return lockShown{Held: "False Free", ManualHolderHeld: "False NoManualHolder", Slots: "0/1"}
			},
		},
		"its manual holder holds them": {
			arrange: func(e *unitEnv) lockShown {
				e.updateLock(unitLockName, func(dl *locksv1alpha1.DistributedLock) {
					dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
				})
				e.reconcileLock(unitLockName)
				s := e.storeState(unitLockName)
				return lockShown{Held: "True Acquired", ManualHolderHeld: "True Acquired",
					Holder: unitCluster + "/DistributedLock/" + unitLockName, Identity: "maintenance", Fence: s.Fence, Slots: "1/1"}
			},
		},
		"a Job of another cluster holds them": {
			arrange: func(e *unitEnv) lockShown {
				h := otherHolder("compact")
				lease := e.takeKeys(e.otherLocker(), unitLockName, h)
				return lockShown{Held: "False HeldByOther", ManualHolderHeld: "False NoManualHolder",
					Holder: "west/Job/compact", Identity: h.Identity, Fence: lease.Fence, Slots: "1/1"}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newUnitEnv(t)
			e.createLock(unitLock(unitLockName))
			want := tc.arrange(e)
			e.reconcileLock(unitLockName)
			if diff := cmp.Diff(want, showLock(e.lock(unitLockName))); diff != "" {
				t.Errorf("the lock's status (-want,+got):\n%s", diff)
			}
		})
	}
}

// The lock's status follows the lock from holder to holder: a handover
// shows the new holder with its larger fencing token, and the queue
// shrinks.
func TestLockStatusFollowsAHandover(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(unitLock(unitLockName))
	for _, n := range []string{"a", "b"} {
		e.submitJob(n, unitLockName)
		e.reconcileJob(n)
	}
	e.reconcileLock(unitLockName)
	before := showLock(e.lock(unitLockName))
	e.finishJob("a")
	e.reconcileJob("a")
	e.reconcileJob("b")
	e.reconcileLock(unitLockName)
	after := showLock(e.lock(unitLockName))

	b := e.job("b")
	want := lockShown{Held: "True Acquired", ManualHolderHeld: "False NoManualHolder",
		Holder: unitCluster + "/Job/b", Identity: jobHolder(b).Identity, Fence: e.jobFence(b), QueueLength: 0, Slots: "1/1"}
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("the lock's status after the handover (-want,+got):\n%s", diff)
	}
	if after.Fence <= before.Fence {
		t.Errorf("status.fencingToken went from %d to %d at the handover, want it larger", before.Fence, after.Fence)
	}
}
