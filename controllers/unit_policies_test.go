package controllers

import (
	"fmt"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// The contention policies that end other workloads: ReplaceQueued (a newer
// Job of a key replaces the waiting ones) and CancelInProgress (it also
// stops the running Job of its lock). They are rules of the store's queue
// (internal/lock: Request.Replace and Request.Preempt); these tests follow
// what a user sees on the Jobs: who runs, who ends and why, which tokens.

// jobFailureTarget is the reason of a Job's FailureTarget condition, or "".
func jobFailureTarget(j *batchv1.Job) string {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobFailureTarget && c.Status == corev1.ConditionTrue {
			return c.Reason
		}
	}
	return ""
}

// policyLock is the unit lock with contention c.
func policyLock(c locksv1alpha1.Contention) *locksv1alpha1.DistributedLock {
	dl := unitLock(unitLockName)
	dl.Spec.Contention = c
	dl.Spec.MaxHolders = 1
	return dl
}

func TestReplaceQueuedRunsOnlyTheNewestWaiter(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(policyLock(locksv1alpha1.ContentionReplaceQueued))
	e.submitJob("deploy-0", unitLockName)
	e.reconcileJob("deploy-0")
	first := e.jobFence(e.job("deploy-0"))
	if first == 0 {
		t.Fatal("deploy-0 did not start on a free lock")
	}
	// Four more arrive while deploy-0 runs; each joins the queue in turn.
	for i := 1; i <= 4; i++ {
		e.submitJob(fmt.Sprintf("deploy-%d", i), unitLockName)
		e.reconcileJob(fmt.Sprintf("deploy-%d", i))
	}
	// The older three learn at their next attempt that they were replaced.
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("deploy-%d", i)
		e.reconcileJob(name)
		j := e.job(name)
		if got := jobFailureTarget(j); got != locksv1alpha1.JobReasonReplaced {
			t.Errorf("%s: FailureTarget reason %q, want %q", name, got, locksv1alpha1.JobReasonReplaced)
		}
		if !suspended(j) || e.jobFence(j) != 0 {
			t.Errorf("%s ran: suspended %v, token %d", name, suspended(j), e.jobFence(j))
		}
		if ev := e.events.on("Job/"+name, locksv1alpha1.EventReplaced); len(ev) != 1 || !strings.Contains(ev[0], "Replaced in the queue of lock "+unitLockName) {
			t.Errorf("%s: Replaced Events %q", name, ev)
		}
	}
	if j := e.job("deploy-0"); suspended(j) || jobFailureTarget(j) != "" {
		t.Fatalf("the running deploy-0 was affected: suspended %v, FailureTarget %q", suspended(j), jobFailureTarget(j))
	}
	e.finishJob("deploy-0")
	e.reconcileJob("deploy-0")
	e.reconcileJob("deploy-4")
	if j := e.job("deploy-4"); suspended(j) || e.jobFence(j) <= first {
		t.Fatalf("the newest waiter did not run next: suspended %v, token %d (deploy-0 had %d)", suspended(j), e.jobFence(j), first)
	}
	// The ended Jobs stay ended: reconciled again, they take nothing.
	for i := 1; i <= 3; i++ {
		e.reconcileJob(fmt.Sprintf("deploy-%d", i))
	}
	if s := e.storeState(unitLockName); s.Holder != jobHolder(e.job("deploy-4")).Encode() || s.Queued != 0 {
		t.Fatalf("after the handover the store shows holder %q and %d queued", s.Holder, s.Queued)
	}
}

func TestCancelInProgressStopsTheRunningJobOfItsLockThenStartsTheNewer(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(policyLock(locksv1alpha1.ContentionCancelInProgress))
	old := e.submitJob("deploy-1", unitLockName)
	e.reconcileJob("deploy-1")
	oldFence := e.jobFence(e.job("deploy-1"))
	e.pods.set(old.UID, "deploy-1-abcde")

	e.submitJob("deploy-2", unitLockName)
	e.reconcileJob("deploy-2")
	if j := e.job("deploy-2"); !suspended(j) {
		t.Fatal("deploy-2 started while deploy-1 held the key")
	}
	if ev := e.events.on("Job/deploy-2", locksv1alpha1.EventCancelling); len(ev) == 0 || !strings.Contains(ev[0], "deploy-1") {
		t.Errorf("deploy-2's Cancelling Events %q do not name the running Job", ev)
	}
	before := e.storeState(unitLockName)

	// The next renewal of deploy-1's lease is refused: the watchdog reports
	// it, and the Job is cancelled.
	e.clock.Step(unitTTL / 3)
	e.dog.RenewDue(e.ctx)
	if got := requested(e.jobs.tracker); len(got) != 1 || got[0] != "deploy-1" {
		t.Fatalf("reconciles asked for after the refused renewal: %v, want deploy-1", got)
	}
	e.reconcileJob("deploy-1")
	j := e.job("deploy-1")
	if got := jobFailureTarget(j); got != locksv1alpha1.JobReasonCancelled {
		t.Fatalf("deploy-1: FailureTarget reason %q, want %q", got, locksv1alpha1.JobReasonCancelled)
	}
	if j.Annotations[locksv1alpha1.AnnotationLost] != "" {
		t.Errorf("the cancelled Job was marked lost: %q", j.Annotations[locksv1alpha1.AnnotationLost])
	}
	for _, on := range []string{"Job/deploy-1", "DistributedLock/" + unitLockName} {
		if ev := e.events.on(on, locksv1alpha1.EventCancelled); len(ev) != 1 || !strings.Contains(ev[0], "CancelInProgress") {
			t.Errorf("Cancelled Events on %s: %q", on, ev)
		}
	}

	// Its pods still stop: the key stays held, not renewed, not shortened,
	// and the newer Job waits.
	e.reconcileJob("deploy-1")
	e.reconcileJob("deploy-2")
	if s := e.storeState(unitLockName); s.Holder != jobHolder(j).Encode() || s.Fence != oldFence || !s.Expires.Equal(before.Expires) {
		t.Fatalf("while its pods stop the store shows holder %q token %d until %v, want deploy-1's %d until %v",
			s.Holder, s.Fence, s.Expires, oldFence, before.Expires)
	}
	if !suspended(e.job("deploy-2")) {
		t.Fatal("deploy-2 started while deploy-1's pods ran")
	}

	// Its pods stopped: the lease is released and deploy-2 starts with a
	// larger token.
	e.pods.set(old.UID)
	e.reconcileJob("deploy-1")
	if ev := e.events.on("Job/deploy-1", locksv1alpha1.EventReleased); len(ev) != 1 {
		t.Errorf("Released Events on deploy-1: %q", ev)
	}
	e.reconcileJob("deploy-2")
	if j := e.job("deploy-2"); suspended(j) || e.jobFence(j) <= oldFence {
		t.Fatalf("deploy-2 after the cancel: suspended %v, token %d (deploy-1 had %d)", suspended(j), e.jobFence(j), oldFence)
	}
	if l, ok := e.jobs.lostOf(types.NamespacedName{Namespace: unitNS, Name: "deploy-1"}); ok {
		t.Errorf("a lost lease of deploy-1 is still remembered: %v", l.Err)
	}
}

// Only a Job of the same lock is stopped: a holder of another lock that
// shares the key, or a manual holder, is waited for.
func TestCancelInProgressWaitsForHoldersThatAreNotJobsOfItsLock(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]func(e *unitEnv) *lock.Lease{
		"a Job of another lock": func(e *unitEnv) *lock.Lease {
			other := otherHolder("compact")
			other.Lock = "compaction"
			return e.takeKeys(e.otherLocker(), unitLockName, other)
		},
		"a manual holder": func(e *unitEnv) *lock.Lease {
			other := otherHolder("oncall")
			other.Kind = "DistributedLock"
			return e.takeKeys(e.otherLocker(), unitLockName, other)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newUnitEnv(t)
			e.createLock(policyLock(locksv1alpha1.ContentionCancelInProgress))
			theirs := h(e)
			e.submitJob("deploy", unitLockName)
			e.reconcileJob("deploy")
			if ev := e.events.on("Job/deploy", locksv1alpha1.EventCancelling); len(ev) != 0 {
				t.Errorf("it asked the holder to stop: %q", ev)
			}
			if _, err := e.otherLocker().Renew(e.ctx, theirs, unitTTL); err != nil {
				t.Fatalf("the holder's renewal failed: %v", err)
			}
			if !suspended(e.job("deploy")) {
				t.Fatal("deploy started while the key was held")
			}
		})
	}
}

func TestReplacedAndCancelledJobsAreDone(t *testing.T) {
	t.Parallel()
	for reason, fence := range map[string]string{locksv1alpha1.JobReasonReplaced: "", locksv1alpha1.JobReasonCancelled: "7"} {
		job := &batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason}}}}
		if fence != "" {
			job.Annotations = map[string]string{locksv1alpha1.AnnotationFencingToken: fence}
		}
		if got := phaseOf(job); got != phaseDone {
			t.Errorf("a Job with FailureTarget %s is in phase %s, want %s", reason, got, phaseDone)
		}
	}
}

// A manual holder waiting behind a running Job, replaced in the queue by a
// newer Job with ReplaceQueued, says so (an Event, no place in the queue in
// its Held condition) instead of reporting its backend as unreachable, and
// joins the queue again once the replacement lapses.
func TestReplacedManualHolderSaysSoAndJoinsAgain(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	e.createLock(policyLock(locksv1alpha1.ContentionReplaceQueued))
	e.submitJob("deploy-0", unitLockName)
	e.reconcileJob("deploy-0")
	e.updateLock(unitLockName, func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	})
	e.reconcileLock(unitLockName)
	e.submitJob("deploy-1", unitLockName)
	e.reconcileJob("deploy-1")

	e.reconcileLock(unitLockName)
	dl := e.lock(unitLockName)
	if ev := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventReplaced); len(ev) == 0 || !strings.Contains(ev[0], "maintenance lost its place in the queue") {
		t.Errorf("Replaced Events on the lock: %q", ev)
	}
	if c := findCondition(dl, locksv1alpha1.ConditionBackendReady); c == nil || c.Status != "True" {
		t.Errorf("BackendReady after the replacement: %+v, want True", c)
	}
	if c := findCondition(dl, locksv1alpha1.ConditionManualHolderHeld); c == nil || !strings.Contains(c.Message, "maintenance waits: no place in the queue yet") {
		t.Errorf("ManualHolderHeld after the replacement: %+v, want it to say the holder has no place in the queue", c)
	}
	// The replacement lapses (two waiter TTLs at most; deploy-0's lease
	// has run out meanwhile, and deploy-1 took the key): it joins again.
	e.clock.Step(3 * lock.DefaultWaiterTTL)
	e.reconcileJob("deploy-1")
	e.reconcileLock(unitLockName)
	if c := findCondition(e.lock(unitLockName), locksv1alpha1.ConditionManualHolderHeld); c == nil || !strings.Contains(c.Message, "maintenance waits: position 1 of 1, behind "+jobHolder(e.job("deploy-1")).Identity) {
		t.Errorf("ManualHolderHeld once the replacement lapsed: %+v, want the holder back in the queue, behind deploy-1", c)
	}
}
