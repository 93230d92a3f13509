package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestLanesStatusStaysSmall: a lock with keyFrom and 8 keys in use shows
// counts summed over the keys, the 5 busiest keys (most holders and waiters
// first), no holder list, and Held True while one of its own holders holds.
func TestLanesStatusStaysSmall(t *testing.T) {
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: unitNS, Name: "deploys", UID: "u1", Generation: 1},
		Spec:       locksv1alpha1.DistributedLockSpec{KeyFrom: &locksv1alpha1.KeyFrom{Expression: `"env/" + object.metadata.labels["env"]`}, MaxHolders: 1, TTLSeconds: 30},
	}
	now := time.Date(2027, 3, 1, 2, 0, 0, 0, time.UTC)
	ours := holder.Holder{Cluster: unitCluster, Namespace: unitNS, Lock: "deploys", Kind: jobKind, Name: "j", UID: "x",
		Identity: holder.WorkloadIdentity(unitCluster, unitNS, jobKind, "j", "x")}.Encode()
	obs := &observation{now: now, lanes: 8}
	for i := range 8 {
		s := lock.KeyState{Key: backend.EngineKey(unitNS, "", fmt.Sprintf("env/e%d", i)), Queued: i}
		if i%2 == 0 {
			s.Held, s.HolderCount, s.Fence = true, 1, int64(100+i)
			s.Holders = []lock.HolderState{{Holder: ours, Fence: int64(100 + i)}}
		}
		obs.states = append(obs.states, s)
	}
	st := computeStatus(dl, obs, unitCluster)
	want := &locksv1alpha1.LanesStatus{Keys: 8, Holders: 4, Waiting: 28, Busiest: []locksv1alpha1.LaneStatus{
		{Key: "env/e6", Holders: 1, Waiting: 6, FencingToken: 106},
		{Key: "env/e7", Waiting: 7},
		{Key: "env/e4", Holders: 1, Waiting: 4, FencingToken: 104},
		{Key: "env/e5", Waiting: 5},
		{Key: "env/e2", Holders: 1, Waiting: 2, FencingToken: 102},
	}}
	if diff := cmp.Diff(want, st.Lanes); diff != "" {
		t.Errorf("status.lanes (-want,+got):\n%s", diff)
	}
	if st.Holder != nil || len(st.Holders) > 0 || len(st.Waiting) > 0 {
		t.Errorf("a lock with keyFrom shows holder %v, holders %v, waiting %v; want none (the counts are in lanes)", st.Holder, st.Holders, st.Waiting)
	}
	if c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionHeld); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Held = %+v, want True: its own Jobs hold 4 keys", c)
	}
}
