package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestManualHoldEndsAfterMaxHoldSeconds: a maintenance window bounded by
// spec.holder.maxHoldSeconds is released when it has held that long, says
// so (ManualHolderHeld False with reason HoldEnded, Event HoldEnded), and
// does not take the lock again until its spec changes.
func TestManualHoldEndsAfterMaxHoldSeconds(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	dl := makeLock("window", ns, rdb.Addr).holder("maintenance").obj()
	const hold = 3 * time.Second
	dl.Spec.Holder.MaxHoldSeconds = int32(hold / time.Second)
	create(t, dl)

	held := waitCondition(t, 15*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	if held.Status.AcquiredTime == nil {
		t.Fatalf("status of the held lock has no acquiredTime: %+v", held.Status)
	}
	ended := waitCondition(t, hold+15*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHoldEnded)
	if at := findCond(ended, locksv1alpha1.ConditionManualHolderHeld).LastTransitionTime.Time; at.Before(held.Status.AcquiredTime.Add(hold - time.Second)) {
		// lastTransitionTime has second precision.
		t.Fatalf("the hold ended at %v, before maxHoldSeconds had passed since it acquired at %v", at, held.Status.AcquiredTime.Time)
	}
	if ended.Status.Holder != nil {
		t.Fatalf("status still shows holder %+v after the hold ended", ended.Status.Holder)
	}
	if _, err := rdb.Client().Get(context.Background(), lockKey(ns, "billing/ledger")).Result(); !errors.Is(err, goredis.Nil) {
		t.Fatalf("the lock key is still set after the hold ended (err %v)", err)
	}
	eventually(t, 10*time.Second, "a HoldEnded event", func() (bool, string) {
		return hasEvent(t, ns, "window", locksv1alpha1.EventHoldEnded)
	})

	// Another reconcile (an annotation change brings one) does not take the lock again.
	touch(t, ns, "window")
	eventually(t, 10*time.Second, "the touched lock to be reconciled", func() (bool, string) {
		dl := getLock(t, ns, "window")
		return dl.Annotations["test/touched"] != "" && dl.Status.ObservedGeneration == dl.Generation, ""
	})
	waitCondition(t, 10*time.Second, ns, "window", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree)
	if _, err := rdb.Client().Get(context.Background(), lockKey(ns, "billing/ledger")).Result(); !errors.Is(err, goredis.Nil) {
		t.Fatalf("the ended hold took the lock again (err %v)", err)
	}

	// A new spec is a new hold.
	patchLock(t, ns, "window", func(dl *locksv1alpha1.DistributedLock) { dl.Spec.Holder.MaxHoldSeconds = 0 })
	again := waitCondition(t, 15*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	if again.Status.FencingToken <= held.Status.FencingToken {
		t.Fatalf("the new hold has fencing token %d, not larger than the ended hold's %d", again.Status.FencingToken, held.Status.FencingToken)
	}
}

// TestManualHoldUntilInThePastDoesNotAcquire: a holder whose until has
// passed never takes the lock; a Job's holder is not affected.
func TestManualHoldUntilInThePastDoesNotAcquire(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	dl := makeLock("window", ns, rdb.Addr).holder("maintenance").obj()
	dl.Spec.Holder.Until = &metav1.Time{Time: time.Now().Add(-time.Minute)}
	create(t, dl)
	got := waitCondition(t, 15*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHoldEnded)
	if c := findCond(got, locksv1alpha1.ConditionHeld); c == nil || c.Reason != locksv1alpha1.ReasonFree {
		t.Fatalf("Held = %+v, want Free: the ended hold must not acquire", c)
	}
	if n, err := rdb.Client().Exists(context.Background(), lockKey(ns, "billing/ledger")).Result(); err != nil || n != 0 {
		t.Fatalf("the lock key exists (%d, %v) for a hold whose until had passed", n, err)
	}

	// until in the future: held until then, then released.
	until := time.Now().Add(4 * time.Second).Truncate(time.Second)
	patchLock(t, ns, "window", func(dl *locksv1alpha1.DistributedLock) { dl.Spec.Holder.Until = &metav1.Time{Time: until} })
	held := waitCondition(t, 15*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	if time.Now().After(until) {
		t.Skipf("the machine is too slow to observe the hold before %v", until)
	}
	ended := waitCondition(t, 20*time.Second, ns, "window", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHoldEnded)
	if at := findCond(ended, locksv1alpha1.ConditionManualHolderHeld).LastTransitionTime.Time; at.Before(until.Add(-time.Second)) {
		t.Fatalf("the hold (token %d) ended at %v, before its until %v", held.Status.FencingToken, at, until)
	}
}

func findCond(dl *locksv1alpha1.DistributedLock, t string) *metav1.Condition {
	for i := range dl.Status.Conditions {
		if dl.Status.Conditions[i].Type == t {
			return &dl.Status.Conditions[i]
		}
	}
	return nil
}

// touch changes an annotation of a lock, which brings a reconcile.
func touch(t *testing.T, ns, name string) {
	t.Helper()
	patchLock(t, ns, name, func(dl *locksv1alpha1.DistributedLock) {
		if dl.Annotations == nil {
			dl.Annotations = map[string]string{}
		}
		dl.Annotations["test/touched"] = time.Now().Format(time.RFC3339Nano)
	})
}

func patchLock(t *testing.T, ns, name string, f func(*locksv1alpha1.DistributedLock)) {
	t.Helper()
	dl := getLock(t, ns, name)
	before := dl.DeepCopy()
	f(dl)
	if err := env.Client.Patch(context.Background(), dl, client.MergeFrom(before)); err != nil {
		t.Fatalf("patch lock %s/%s: %v", ns, name, err)
	}
}
