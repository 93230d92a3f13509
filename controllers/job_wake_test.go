package controllers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestPlanWakeGivesTheFreeSlotsToTheHeadOfTheQueue: a release wakes the
// Jobs the free slots go to, in queue order, and nobody else unless slots
// remain for waiters the store's state does not name.
func TestPlanWakeGivesTheFreeSlotsToTheHeadOfTheQueue(t *testing.T) {
	const cluster = "c1"
	dl := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "billing"},
		Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"k"}}}
	sem := dl.DeepCopy()
	sem.Spec.MaxHolders = 3
	job := func(name string) batchv1.Job {
		return batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
	}
	jobs := []batchv1.Job{job("a"), job("b"), job("c")}
	waiter := func(cluster, name, uid string) lock.Waiter {
		return lock.Waiter{Holder: holder.Holder{Cluster: cluster, Namespace: "ns", Lock: "billing", Kind: jobKind, Name: name, UID: uid, Identity: name}.Encode()}
	}
	ours := func(name string) lock.Waiter { return waiter(cluster, name, "uid-"+name) }
	manual := lock.Waiter{Holder: holder.Holder{Cluster: cluster, Namespace: "ns", Lock: "billing", Kind: lockKind, Name: "billing", UID: "u", Identity: "maint"}.Encode()}
	nn := func(names ...string) []types.NamespacedName {
		var out []types.NamespacedName
		for _, n := range names {
			out = append(out, types.NamespacedName{Namespace: "ns", Name: n})
		}
		return out
	}
	type want struct {
		wake []types.NamespacedName
		gone []string
		all  bool
		// places: "name position/waiters holder"
		places []string
	}
	cases := map[string]struct {
		dl    *locksv1alpha1.DistributedLock
		state lock.KeyState
		want  want
	}{
		"mutex still held: nobody, but the places of those listed": {dl, lock.KeyState{Key: "ns/ns/k", Held: true, Holder: "h", Fence: 7, HolderCount: 1, Waiters: []lock.Waiter{ours("a"), manual, waiter(cluster, "x", "gone"), ours("b")}, Queued: 12},
			want{gone: []string{"x"}, places: []string{"a 0/11 h", "b 2/11 h"}}},
		"another key of the lock: no places":                               {dl, lock.KeyState{Key: "ns/ns/other", Held: true, Holder: "h", HolderCount: 1, Waiters: []lock.Waiter{ours("a")}, Queued: 1}, want{}},
		"mutex freed: the head only":                                       {dl, lock.KeyState{Waiters: []lock.Waiter{ours("a"), ours("b"), ours("c")}, Queued: 3}, want{wake: nn("a")}},
		"semaphore, two slots free: the first two":                         {sem, lock.KeyState{HolderCount: 1, Waiters: []lock.Waiter{ours("b"), ours("a"), ours("c")}, Queued: 3}, want{wake: nn("b", "a")}},
		"a manual holder and another cluster's Job take their slots":       {sem, lock.KeyState{Waiters: []lock.Waiter{manual, waiter("c2", "a", "uid-a"), ours("c"), ours("b")}, Queued: 4}, want{wake: nn("c")}},
		"a gone Job leaves the queue and its slot to the next":             {dl, lock.KeyState{Waiters: []lock.Waiter{waiter(cluster, "a", "old-uid"), ours("x"), ours("b")}, Queued: 3}, want{wake: nn("b"), gone: []string{"a", "x"}}},
		"empty queue: every waiting Job":                                   {dl, lock.KeyState{}, want{all: true}},
		"more slots than waiters listed: the head, then every waiting Job": {sem, lock.KeyState{HolderCount: 1, Waiters: []lock.Waiter{ours("c")}, Queued: 1}, want{wake: nn("c"), all: true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := planWake(cluster, []lockJobs{{dl: tc.dl, keys: backend.EngineKeys(tc.dl), jobs: jobs}}, tc.state)
			got := want{wake: p.wake, all: p.all}
			for n, b := range p.places {
				got.places = append(got.places, fmt.Sprintf("%s %d/%d %s", n.Name, b.Position, b.Waiters, b.Holder))
			}
			slices.Sort(got.places)
			for _, g := range p.gone {
				got.gone = append(got.gone, g.holder.Name)
				if !slices.Equal(g.keys, []string{"ns/ns/k"}) {
					t.Errorf("gone waiter %s dequeued from %v, want the lock's keys", g.holder.Name, g.keys)
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("plan (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestPlaceIsShownOnlyWhileFreshAndNoAttemptIsDue: a place read from the
// store replaces a waiting Job's call to the store only while it is newer
// than the Job's last attempt, young, and the attempt that keeps the Job's
// place in the queue is not due; it is shown once.
func TestPlaceIsShownOnlyWhileFreshAndNoAttemptIsDue(t *testing.T) {
	nn := types.NamespacedName{Namespace: "ns", Name: "a"}
	t0 := time.Unix(1000, 0)
	const requeue = 5 * time.Second
	busy := &lock.HeldError{Key: "k", Position: 1, Waiters: 2}
	cases := map[string]struct {
		tried, at, now time.Time
		want           bool
	}{
		"fresh":                  {tried: t0, at: t0.Add(time.Second), now: t0.Add(1100 * time.Millisecond), want: true},
		"never tried":            {at: t0, now: t0},
		"older than the attempt": {tried: t0.Add(time.Second), at: t0, now: t0.Add(time.Second)},
		"too old":                {tried: t0, at: t0.Add(time.Second), now: t0.Add(time.Second + placeMaxAge + time.Millisecond)},
		"attempt due":            {tried: t0, at: t0.Add(4 * time.Second), now: t0.Add(requeue)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := newWaitMemory()
			if !tc.tried.IsZero() {
				m.triedAt(nn, tc.tried)
			}
			m.setPlace(nn, busy, tc.at)
			got, due, ok := m.takePlace(nn, tc.now, requeue)
			if ok != tc.want || (ok && (got != busy || !due.Equal(tc.tried.Add(requeue)))) {
				t.Fatalf("takePlace = %v, %v, %v; want ok %v (due %v)", got, due, ok, tc.want, tc.tried.Add(requeue))
			}
			if _, _, again := m.takePlace(nn, tc.now, requeue); again {
				t.Fatal("a place was shown twice")
			}
		})
	}
}

// TestOwnWaitWriteIsOnlyTheEchoOfTheOperatorsWrite: the update a write of
// the waiting annotations causes reconciles nothing; any other change does.
func TestOwnWaitWriteIsOnlyTheEchoOfTheOperatorsWrite(t *testing.T) {
	r := &JobReconciler{waits: newWaitMemory()}
	old := makeJob("a", "ns").annotate(locksv1alpha1.AnnotationQueuePosition, "3/3").annotate(locksv1alpha1.AnnotationWaitingFor, "x").obj()
	old.ResourceVersion = "1"
	echo := old.DeepCopy()
	echo.ResourceVersion = "2"
	echo.Annotations[locksv1alpha1.AnnotationQueuePosition] = "2/2"
	echo.Annotations[locksv1alpha1.AnnotationWaitingFor] = "y"
	if r.ownWaitWrite(old, echo) {
		t.Fatal("an update nobody announced was taken for an echo")
	}
	r.waits.willWrite(nn("ns", "a"), waitShown{"2/2", "y"})
	if !r.ownWaitWrite(old, echo) {
		t.Fatal("the echo of the operator's write reconciles")
	}
	other := echo.DeepCopy()
	other.Annotations[locksv1alpha1.AnnotationContention] = "Skip"
	tampered := echo.DeepCopy()
	tampered.Annotations[locksv1alpha1.AnnotationQueuePosition] = "1/99"
	for name, n := range map[string]*batchv1.Job{"another change too": other, "other values": tampered, "no change of them": old} {
		if r.ownWaitWrite(old, n) {
			t.Errorf("%s: taken for an echo", name)
		}
	}
}
