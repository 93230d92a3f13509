package controllers

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Weights (lockwarden.io/weight): on a lock of maxHolders 4, a weight-3 Job
// and six weight-1 Jobs. The slots taken never exceed 4; the heavy Job,
// once at the head of the queue, is not passed by the light ones behind it
// although a slot is free, and starts as soon as the holders it found
// release. The run is on the unit harness's fake clock: waiting Jobs are
// reconciled every 5 s, as the controller requeues them.

func TestUnitWeightedJobTakesItsSlotsWithoutStarving(t *testing.T) {
	t.Parallel()
	const (
		limit = 4
		run   = time.Minute // how long each Job runs once started
		tick  = 5 * time.Second
	)
	e := newUnitEnv(t)
	dl := unitLock(unitLockName)
	dl.Spec.MaxHolders = limit
	e.createLock(dl)

	type weightedJob struct {
		name            string
		weight          int
		arrival, start  time.Time
		started, ended  bool
		holdersAtArrive []string
	}
	// Two light Jobs first, the heavy one 10 s later, then four light ones.
	plan := []*weightedJob{{name: "light-1", weight: 1}, {name: "light-2", weight: 1}, {name: "heavy", weight: 3},
		{name: "light-3", weight: 1}, {name: "light-4", weight: 1}, {name: "light-5", weight: 1}, {name: "light-6", weight: 1}}
	arriveAt := []time.Duration{0, 0, 10 * time.Second, 20 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second}
	for i, j := range plan {
		j.arrival = unitStart.Add(arriveAt[i])
	}
	running := func() (names []string, slots int) {
		for _, j := range plan {
			if j.started && !j.ended {
				names = append(names, j.name)
				slots += j.weight
			}
		}
		return names, slots
	}
	peak, freeWhileHeavyWaited := 0, false
	check := func() {
		t.Helper()
		_, slots := running()
		peak = max(peak, slots)
		if slots > limit {
			names, _ := running()
			t.Fatalf("at %v: %d slots taken by %v, more than maxHolders %d", e.clock.Now().Sub(unitStart), slots, names, limit)
		}
		if st := e.storeState(unitLockName); slotsTaken(st) > limit {
			t.Fatalf("at %v: the store holds %d slots, more than %d", e.clock.Now().Sub(unitStart), slotsTaken(st), limit)
		}
	}
	for now := unitStart; ; now = now.Add(tick) {
		e.clock.SetTime(now)
		e.dog.RenewDue(e.ctx) // the holders' leases, renewed as the watchdog does
		done := true
		for _, j := range plan {
			if j.started && !j.ended && !now.Before(j.start.Add(run)) {
				e.finishJob(j.name)
				e.reconcileJob(j.name)
				j.ended = true
			}
			if !j.ended {
				done = false
			}
		}
		if done {
			break
		}
		for _, j := range plan {
			if j.arrival.Equal(now) {
				j.holdersAtArrive, _ = running()
				ann := map[string]string{}
				if j.weight > 1 {
					ann[locksv1alpha1.AnnotationWeight] = strconv.Itoa(j.weight)
				}
				e.submitJobWith(j.name, unitLockName, ann)
			}
		}
		// Every waiting Job tries, in turn, until none starts.
		for changed := true; changed; {
			changed = false
			for _, j := range plan {
				if j.started || now.Before(j.arrival) {
					continue
				}
				e.reconcileJob(j.name)
				if !suspended(e.job(j.name)) {
					j.started, j.start, changed = true, now, true
					check()
				}
			}
		}
		heavy := plan[2]
		if heavy.started && heavy.start.Equal(now) {
			// What kubectl get shows while it runs: the slots it takes.
			e.reconcileLock(unitLockName)
			st := e.lock(unitLockName).Status
			_, slots := running()
			if want := fmt.Sprintf("%d/%d", slots, limit); st.Slots != want {
				t.Errorf("status.slots %q with %d slots taken; want %q", st.Slots, slots, want)
			}
			weights := map[string]int32{}
			for _, h := range st.Holders {
				weights[h.Name] = h.Weight
			}
			if weights["heavy"] != 3 {
				t.Errorf("status.holders weights %v; want heavy with weight 3", weights)
			}
		}
		if _, slots := running(); !now.Before(heavy.arrival) && !heavy.started && slots < limit {
			freeWhileHeavyWaited = true
			for _, j := range plan[3:] {
				if j.started {
					t.Fatalf("%s (weight 1) started at %v while the heavy Job, ahead of it, waited", j.name, j.start.Sub(unitStart))
				}
			}
		}
		if now.Sub(unitStart) > time.Hour {
			t.Fatal("the Jobs did not all run within an hour")
		}
	}
	heavy := plan[2]
	// The bound: the heavy Job waits only for the holders it found.
	bound := time.Duration(0)
	for _, name := range heavy.holdersAtArrive {
		for _, j := range plan {
			if j.name == name {
				bound = max(bound, j.start.Add(run).Sub(heavy.arrival))
			}
		}
	}
	wait := heavy.start.Sub(heavy.arrival)
	if wait > bound+tick {
		t.Errorf("the heavy Job waited %v; the holders it found (%v) released within %v", wait, heavy.holdersAtArrive, bound)
	}
	if !freeWhileHeavyWaited {
		t.Error("no slot was ever free while the heavy Job waited: the run did not test that light Jobs do not pass it")
	}
	if peak != limit {
		t.Errorf("at most %d slots were taken at once; the run should fill all %d", peak, limit)
	}
	var order string
	for _, j := range plan {
		order += fmt.Sprintf(" %s@%v", j.name, j.start.Sub(unitStart))
	}
	t.Logf("maxHolders %d, runs of %v: peak %d slots; heavy (weight 3) arrived at %v behind %v, started after %v (bound %v); starts:%s",
		limit, run, peak, heavy.arrival.Sub(unitStart), heavy.holdersAtArrive, wait, bound, order)
}
