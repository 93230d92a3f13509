package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// advance moves the fake clock by d in steps of a third of the TTL, with
// the watchdog's renewals due at each step, as the running operator renews
// its leases; each of reconcile is called after every step.
func (e *unitEnv) advance(d time.Duration, reconcile ...func()) {
	e.t.Helper()
	for d > 0 {
		step := min(d, unitTTL/3)
		e.clock.Step(step)
		e.dog.RenewDue(e.ctx)
		for _, f := range reconcile {
			f()
		}
		d -= step
	}
}

// TestUnitHoldWindowInBerlinHoldsTheLockAndJobsWaitUntilItCloses: a lock
// with a daily hold at 03:01 Europe/Berlin for 30 minutes. The unit clock
// starts at 02:00 UTC on 1 March, 03:00 in Berlin (CET, UTC+1), so the
// window opens a minute later, at 02:01 UTC (read in UTC it would open an
// hour later). A Job that runs when the window opens keeps running, and
// the hold takes the keys when it finishes; a Job created in the window
// waits until the window closes, then starts with a larger fencing token.
// Status names the window and its end and the next one; Events say when
// it opens and closes.
func TestUnitHoldWindowInBerlinHoldsTheLockAndJobsWaitUntilItCloses(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.Holds = []locksv1alpha1.RecurringHold{{Name: "nightly", Schedule: "1 3 * * *", DurationSeconds: 30 * 60, TimeZone: "Europe/Berlin"}}
	e.createLock(dl)
	opens := unitStart.Add(time.Minute)
	closes := opens.Add(30 * time.Minute)

	got := e.lock(unitLockName)
	if c := findCondition(got, locksv1alpha1.ConditionHoldActive); c == nil || c.Status != metav1.ConditionFalse || c.Reason != locksv1alpha1.ReasonNoWindowOpen {
		t.Fatalf("before the window: HoldActive = %+v, want False/NoWindowOpen", c)
	}
	if n := got.Status.NextHold; n == nil || n.Name != "nightly" || !n.Start.Time.Equal(opens) {
		t.Fatalf("before the window: nextHold = %+v, want nightly at %v", n, opens)
	}
	if res := e.reconcileLock(unitLockName); res.RequeueAfter <= 0 || res.RequeueAfter > time.Minute {
		t.Fatalf("before the window the lock asks to be reconciled after %v, want at the window's start, in %v", res.RequeueAfter, time.Minute)
	}

	// A Job that runs before the window opens.
	e.submitJob("early", unitLockName)
	e.reconcileJob("early")
	early := e.job("early")
	if suspended(early) {
		t.Fatal("the Job before the window did not start")
	}
	f1 := e.jobFence(early)

	// The window opens: the hold queues behind the running Job, which runs on.
	e.advance(time.Minute, func() { e.reconcileJob("early") })
	e.reconcileLock(unitLockName)
	got = e.lock(unitLockName)
	if c := findCondition(got, locksv1alpha1.ConditionHoldActive); c == nil || c.Status != metav1.ConditionFalse || c.Reason != locksv1alpha1.ReasonWaiting {
		t.Fatalf("window open behind a running Job: HoldActive = %+v, want False/Waiting", c)
	}
	if a := got.Status.ActiveHold; a == nil || a.Name != "nightly" || !a.Start.Time.Equal(opens) || !a.End.Time.Equal(closes) {
		t.Fatalf("activeHold = %+v, want nightly from %v to %v", a, opens, closes)
	}
	if opened := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventHoldWindowOpened); len(opened) != 1 {
		t.Fatalf("HoldWindowOpened Events: %q, want one", opened)
	}
	if suspended(e.job("early")) {
		t.Fatal("the Job that ran before the window was stopped when the window opened")
	}

	// The Job finishes: the hold takes the keys.
	e.finishJob("early")
	e.reconcileJob("early")
	e.reconcileLock(unitLockName)
	got = e.lock(unitLockName)
	if c := findCondition(got, locksv1alpha1.ConditionHoldActive); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("after the Job finished in the window: HoldActive = %+v, want True", c)
	}
	if got.Status.Holder == nil || got.Status.Holder.Identity != "hold/nightly" || got.Status.FencingToken <= f1 {
		t.Fatalf("status holder %+v with token %d, want hold/nightly with a token larger than %d", got.Status.Holder, got.Status.FencingToken, f1)
	}
	fHold := got.Status.FencingToken

	// A Job created in the window waits for it to close.
	e.submitJob("late", unitLockName)
	e.reconcileJob("late")
	if !suspended(e.job("late")) {
		t.Fatal("a Job created in the window started")
	}
	e.advance(closes.Sub(e.clock.Now())-time.Second, func() {
		e.reconcileJob("late")
		if e.lock(unitLockName).Status.ActiveHold != nil {
			e.reconcileLock(unitLockName)
		}
	})
	if !suspended(e.job("late")) {
		t.Fatalf("the Job created in the window started at %v, before the window closed at %v", e.clock.Now(), closes)
	}
	if w := e.job("late").Annotations[locksv1alpha1.AnnotationWaitingFor]; !strings.Contains(w, "hold/nightly") {
		t.Errorf("the waiting Job's %s is %q, want it to name hold/nightly", locksv1alpha1.AnnotationWaitingFor, w)
	}

	// The window closes: the hold releases and the Job starts.
	e.clock.Step(time.Second)
	e.reconcileLock(unitLockName)
	got = e.lock(unitLockName)
	if c := findCondition(got, locksv1alpha1.ConditionHoldActive); c == nil || c.Status != metav1.ConditionFalse || c.Reason != locksv1alpha1.ReasonNoWindowOpen {
		t.Fatalf("after the window: HoldActive = %+v, want False/NoWindowOpen", c)
	}
	if got.Status.ActiveHold != nil {
		t.Fatalf("after the window, activeHold = %+v", got.Status.ActiveHold)
	}
	if n := got.Status.NextHold; n == nil || !n.Start.Time.Equal(opens.Add(24*time.Hour)) {
		t.Fatalf("after the window, nextHold = %+v, want the next day's at %v", n, opens.Add(24*time.Hour))
	}
	if closed := e.events.on("DistributedLock/"+unitLockName, locksv1alpha1.EventHoldWindowClosed); len(closed) != 1 {
		t.Fatalf("HoldWindowClosed Events: %q, want one", closed)
	}
	e.reconcileJob("late")
	late := e.job("late")
	if suspended(late) {
		t.Fatal("the Job created in the window did not start when the window closed")
	}
	if f := e.jobFence(late); f <= fHold {
		t.Fatalf("the Job after the window got fencing token %d, not larger than the hold's %d", f, fHold)
	}
}

// TestUnitCooldownKeepsTheNextJobWaitingForCooldownSeconds: with
// cooldownSeconds 120 the keys stay held, in the store, for 120 seconds
// after a Job releases them: the next Job starts no sooner, measured on the
// fake clock, and the lock shows why (Held reason Cooldown, cooldownUntil).
func TestUnitCooldownKeepsTheNextJobWaitingForCooldownSeconds(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.CooldownSeconds = 120
	e.createLock(dl)
	e.submitJob("first", unitLockName)
	e.reconcileJob("first")
	first := e.job("first")
	f1 := e.jobFence(first)
	e.submitJob("second", unitLockName)
	e.reconcileJob("second")

	e.clock.Step(5 * time.Second)
	e.dog.RenewDue(e.ctx)
	e.finishJob("first")
	e.reconcileJob("first")
	released := e.clock.Now()
	if rel := e.events.on("Job/first", locksv1alpha1.EventReleased); len(rel) != 1 || !strings.Contains(rel[0], "stay held until") {
		t.Fatalf("Released Events on the first Job: %q, want one naming the cooldown", rel)
	}
	s := e.storeState(unitLockName)
	if !s.Held || s.Fence != f1 || s.Holder != jobHolder(first).Encode() {
		t.Fatalf("right after the release the store shows holder %q token %d held %v, want the first Job's lease (token %d) cooling down", s.Holder, s.Fence, s.Held, f1)
	}
	res := e.reconcileLock(unitLockName)
	got := e.lock(unitLockName)
	if c := findCondition(got, locksv1alpha1.ConditionHeld); c == nil || c.Reason != locksv1alpha1.ReasonCooldown {
		t.Fatalf("Held = %+v, want reason Cooldown", c)
	}
	if got.Status.CooldownUntil == nil || !got.Status.CooldownUntil.Time.Equal(released.Add(120*time.Second)) {
		t.Fatalf("cooldownUntil = %v, want %v", got.Status.CooldownUntil, released.Add(120*time.Second))
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > 120*time.Second {
		t.Fatalf("the cooling lock asks to be reconciled after %v, want by the cooldown's end", res.RequeueAfter)
	}

	// Step a second at a time, the waiting Job looking each time.
	for e.clock.Now().Sub(released) < 5*time.Minute {
		e.clock.Step(time.Second)
		e.dog.RenewDue(e.ctx)
		e.reconcileJob("second")
		if !suspended(e.job("second")) {
			break
		}
	}
	second := e.job("second")
	if suspended(second) {
		t.Fatal("the next Job never started")
	}
	if waited := e.clock.Now().Sub(released); waited < 120*time.Second || waited > 122*time.Second {
		t.Fatalf("the next Job started %v after the release, want 120s (cooldownSeconds)", waited)
	}
	if f2 := e.jobFence(second); f2 <= f1 {
		t.Fatalf("the next Job got fencing token %d, not larger than %d", f2, f1)
	}
	e.reconcileLock(unitLockName)
	if got := e.lock(unitLockName); got.Status.CooldownUntil != nil {
		t.Fatalf("cooldownUntil %v still shown while the next Job holds", got.Status.CooldownUntil)
	}
}

// TestUnitCooldownAfterTheManualHolderIsRemovedSurvivesTheLockReconciles:
// removing spec.holder from a lock with cooldownSeconds 120 leaves the
// manual holder's lease in the store, cooling down; the lock's own
// reconciles (which release leases of holders no longer wanted) leave it
// alone, and the waiting Job starts 120 s after the release, not before.
func TestUnitCooldownAfterTheManualHolderIsRemovedSurvivesTheLockReconciles(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.CooldownSeconds = 120
	dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	e.createLock(dl)
	if c := findCondition(e.lock(unitLockName), locksv1alpha1.ConditionManualHolderHeld); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("ManualHolderHeld = %+v, want True", c)
	}
	fManual := e.lock(unitLockName).Status.FencingToken
	e.submitJob("next", unitLockName)
	e.reconcileJob("next")

	e.updateLock(unitLockName, func(dl *locksv1alpha1.DistributedLock) { dl.Spec.Holder = nil })
	e.reconcileLock(unitLockName)
	released := e.clock.Now()
	if s := e.storeState(unitLockName); !s.Held || s.Fence != fManual {
		t.Fatalf("after spec.holder was removed the store shows held %v with token %d, want the manual lease (token %d) cooling down", s.Held, s.Fence, fManual)
	}
	for e.clock.Now().Sub(released) < 5*time.Minute {
		e.clock.Step(time.Second)
		e.dog.RenewDue(e.ctx)
		e.reconcileLock(unitLockName)
		e.reconcileJob("next")
		if !suspended(e.job("next")) {
			break
		}
	}
	if waited := e.clock.Now().Sub(released); suspended(e.job("next")) || waited < 120*time.Second || waited > 122*time.Second {
		t.Fatalf("the Job started %v after the manual holder was removed (suspended %v), want 120s", waited, suspended(e.job("next")))
	}
	if f := e.jobFence(e.job("next")); f <= fManual {
		t.Fatalf("the Job got fencing token %d, not larger than the manual holder's %d", f, fManual)
	}
}

// TestUnitClosingHoldWindowDoesNotStartACooldown: on a lock with
// cooldownSeconds 600, the end of a hold window is the documented end of
// the freeze: the Job that waited for it starts as the window closes, not
// ten minutes later.
func TestUnitClosingHoldWindowDoesNotStartACooldown(t *testing.T) {
	t.Parallel()
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.CooldownSeconds = 600
	dl.Spec.Holds = []locksv1alpha1.RecurringHold{{Name: "nightly", Schedule: "1 3 * * *", DurationSeconds: 5 * 60, TimeZone: "Europe/Berlin"}}
	e.createLock(dl)
	closes := unitStart.Add(6 * time.Minute)
	e.advance(time.Minute)
	e.reconcileLock(unitLockName)
	if h := e.lock(unitLockName).Status.Holder; h == nil || h.Identity != "hold/nightly" {
		t.Fatalf("in the window the lock is held by %+v, want hold/nightly", h)
	}
	e.submitJob("deploy", unitLockName)
	e.reconcileJob("deploy")
	e.advance(closes.Sub(e.clock.Now()), func() { e.reconcileJob("deploy") })
	e.reconcileLock(unitLockName)
	e.reconcileJob("deploy")
	if suspended(e.job("deploy")) {
		t.Fatalf("the Job still waits after the window closed; the lock shows %+v, cooldownUntil %v",
			e.lock(unitLockName).Status.Holder, e.lock(unitLockName).Status.CooldownUntil)
	}
}
