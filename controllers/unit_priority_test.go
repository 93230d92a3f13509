package controllers

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
)

// Priority with aging (spec.priority): a stream of urgent Jobs arrives
// faster than the lock serves them, behind 200 ordinary ones. Urgent Jobs
// go first, yet no Job is passed by one that arrived more than
// maxStarvationSeconds after it. The run is on the unit harness's fake
// clock: every Job holds the lock for prioHold, the whole run takes about
// 45 minutes of fake time and a second of real time.

const (
	prioLows       = 200
	prioHold       = 10 * time.Second
	prioHighEvery  = 8 * time.Second // faster than the lock serves: priority alone would starve the rest
	prioHighUntil  = 10 * time.Minute
	prioStarvation = 300 // spec.priority.maxStarvationSeconds
	prioHighest    = 1000
)

// prioJob is one Job of a priority run, as the user sees it.
type prioJob struct {
	name            string
	priority        int32
	arrival, start  time.Time
	started         bool
	rankBoost       time.Duration // its head start on the lock, per backend.Boost
	waitedForNobody bool          // started at its arrival
}

func (j *prioJob) rank() time.Time { return j.arrival.Add(-j.rankBoost) }

// runPriorityStream runs prioLows Jobs of priority 0, then one of priority
// prioHighest every prioHighEvery until prioHighUntil, on a lock with
// maxStarvationSeconds starvation; each Job holds the lock for prioHold.
// When the holder ends, the Job at the head of the store's queue is
// reconciled (the controller wakes it so) and must start.
func runPriorityStream(t *testing.T, starvation int32) []*prioJob {
	e := newUnitEnv(t)
	e.waiterTTL = time.Hour // nobody calls again while it waits: the test is about order
	dl := unitLock(unitLockName)
	dl.Spec.MaxHolders = 1
	dl.Spec.Priority = &locksv1alpha1.Priority{MaxStarvationSeconds: starvation, Highest: prioHighest}
	e.createLock(dl)

	var arrivals []*prioJob
	for i := range prioLows {
		arrivals = append(arrivals, &prioJob{name: fmt.Sprintf("low-%03d", i), arrival: unitStart.Add(time.Duration(i) * 100 * time.Millisecond)})
	}
	for k := 1; time.Duration(k)*prioHighEvery <= prioHighUntil; k++ {
		arrivals = append(arrivals, &prioJob{name: fmt.Sprintf("high-%03d", k), priority: prioHighest, arrival: unitStart.Add(time.Duration(k) * prioHighEvery)})
	}
	slices.SortStableFunc(arrivals, func(a, b *prioJob) int { return a.arrival.Compare(b.arrival) })
	byName := map[string]*prioJob{}
	for _, j := range arrivals {
		j.rankBoost = backend.Boost(dl, j.priority)
		byName[j.name] = j
	}
	jobs := slices.Clone(arrivals)

	var running *prioJob
	start := func(j *prioJob) {
		t.Helper()
		if suspended(e.job(j.name)) || e.jobFence(e.job(j.name)) == 0 {
			t.Fatalf("%s at the head of the queue did not start when the lock was released at %v", j.name, e.clock.Now().Sub(unitStart))
		}
		j.started, j.start, running = true, e.clock.Now(), j
	}
	for len(arrivals) > 0 || running != nil {
		endsAt := time.Time{}
		if running != nil {
			endsAt = running.start.Add(prioHold)
		}
		if len(arrivals) > 0 && (running == nil || arrivals[0].arrival.Before(endsAt)) {
			j := arrivals[0]
			arrivals = arrivals[1:]
			e.clock.SetTime(j.arrival)
			ann := map[string]string{}
			if j.priority != 0 {
				ann[locksv1alpha1.AnnotationPriority] = strconv.Itoa(int(j.priority))
			}
			e.submitJobWith(j.name, unitLockName, ann)
			e.reconcileJob(j.name)
			if !suspended(e.job(j.name)) {
				if running != nil {
					t.Fatalf("%s started while %s held the lock", j.name, running.name)
				}
				start(j)
				j.waitedForNobody = true
			}
			continue
		}
		e.clock.SetTime(endsAt)
		e.finishJob(running.name)
		e.reconcileJob(running.name)
		ended := running.name
		running = nil
		st := e.storeState(unitLockName)
		if st.Held {
			t.Fatalf("the lock is still held after %s ended: %+v", ended, st)
		}
		if len(st.Waiters) == 0 {
			continue
		}
		head := byName[holder.Decode(st.Waiters[0].Holder).Name]
		if head == nil {
			t.Fatalf("the head of the queue %q is no Job of the run", st.Waiters[0].Holder)
		}
		e.reconcileJob(head.name)
		start(head)
	}
	return jobs
}

// headViolations lists the starts of Jobs that were not first by the
// rule (arrival minus head start, then arrival) among those waiting then.
func headViolations(jobs []*prioJob) []string {
	var out []string
	for _, y := range jobs {
		if y.waitedForNobody {
			continue
		}
		for _, x := range jobs {
			waiting := x != y && !x.arrival.After(y.start) && x.start.After(y.start)
			if waiting && cmp.Or(y.rank().Compare(x.rank()), y.arrival.Compare(x.arrival)) > 0 {
				out = append(out, fmt.Sprintf("%s started before %s, which was ahead of it", y.name, x.name))
			}
		}
	}
	return out
}

// agingViolations lists the Jobs passed by one that arrived more than
// bound after them: what maxStarvationSeconds promises never happens.
func agingViolations(jobs []*prioJob, bound time.Duration) []string {
	var out []string
	for _, y := range jobs {
		for _, x := range jobs {
			if x.arrival.Sub(y.arrival) > bound && x.start.Before(y.start) {
				out = append(out, fmt.Sprintf("%s (arrived %v) started before %s (arrived %v)", x.name, x.arrival.Sub(unitStart), y.name, y.arrival.Sub(unitStart)))
			}
		}
	}
	return out
}

func waits(jobs []*prioJob, priority int32) []time.Duration {
	var out []time.Duration
	for _, j := range jobs {
		if j.priority == priority {
			out = append(out, j.start.Sub(j.arrival))
		}
	}
	slices.Sort(out)
	return out
}

func TestUnitPriorityGoesFirstWithinTheStarvationBound(t *testing.T) {
	t.Parallel()
	bound := prioStarvation * time.Second
	jobs := runPriorityStream(t, prioStarvation)
	for _, j := range jobs {
		if !j.started {
			t.Fatalf("%s never ran", j.name)
		}
	}
	if v := headViolations(jobs); len(v) > 0 {
		t.Errorf("%d Jobs started out of the queue's order, first: %q", len(v), v[:min(len(v), 3)])
	}
	if v := agingViolations(jobs, bound); len(v) > 0 {
		t.Errorf("%d Jobs passed by one that arrived more than maxStarvationSeconds (%v) after them, first: %q", len(v), bound, v[:min(len(v), 3)])
	}
	// Urgent Jobs go first: each high-priority Job starts before every
	// ordinary one that arrived less than maxStarvationSeconds before it
	// and had not started yet.
	passed := 0
	for _, h := range jobs {
		for _, l := range jobs {
			if h.priority == prioHighest && l.priority == 0 && l.arrival.Before(h.arrival) && h.arrival.Sub(l.arrival) < bound && l.start.After(h.arrival) {
				if !h.start.Before(l.start) {
					t.Errorf("%s (priority %d, arrived %v) started after %s (priority 0, arrived %v)", h.name, h.priority, h.arrival.Sub(unitStart), l.name, l.arrival.Sub(unitStart))
				}
				passed++
			}
		}
	}
	if passed == 0 {
		t.Fatal("no urgent Job arrived while ordinary ones waited: the run shows nothing")
	}
	low, high := waits(jobs, 0), waits(jobs, prioHighest)
	// The longest an ordinary Job can wait: until every Job ahead of it by
	// the rule has held the lock, that is the ordinary Jobs before it and
	// the urgent ones that arrived within maxStarvationSeconds after it.
	last := jobs[0]
	for _, j := range jobs {
		if j.priority == 0 && j.start.Sub(j.arrival) > last.start.Sub(last.arrival) {
			last = j
		}
	}
	ahead := 0
	for _, j := range jobs {
		if j != last && cmp.Or(j.rank().Compare(last.rank()), j.arrival.Compare(last.arrival)) < 0 {
			ahead++
		}
	}
	limit := time.Duration(ahead+1) * prioHold
	if got := last.start.Sub(last.arrival); got > limit {
		t.Errorf("%s waited %v, longer than the %d Jobs ahead of it by the rule take (%v)", last.name, got, ahead, limit)
	}
	t.Logf("%d ordinary Jobs, %d urgent (one every %v until %v), hold %v, maxStarvationSeconds %d: urgent wait median %v, max %v; ordinary wait median %v, max %v (%s, behind %d Jobs by the rule, at most %v); urgent Jobs ahead of an ordinary one that had waited: %d",
		len(low), len(high), prioHighEvery, prioHighUntil, prioHold, prioStarvation,
		high[len(high)/2], high[len(high)-1], low[len(low)/2], low[len(low)-1], last.name, ahead, limit, passed)
}

// TestUnitPriorityAgingCheckCatchesStrictPriority is the negative control of
// the aging check above: with a head start far beyond the bound checked
// (strict priority for the whole run), urgent Jobs keep passing ordinary
// ones that waited longer than the bound, and the check must say so.
func TestUnitPriorityAgingCheckCatchesStrictPriority(t *testing.T) {
	t.Parallel()
	jobs := runPriorityStream(t, 86400)
	if v := headViolations(jobs); len(v) > 0 {
		t.Errorf("%d Jobs started out of the queue's order, first: %q", len(v), v[:min(len(v), 3)])
	}
	if v := agingViolations(jobs, prioStarvation*time.Second); len(v) == 0 {
		t.Fatal("with strict priority the aging check found no ordinary Job passed after it waited maxStarvationSeconds: it cannot fail")
	} else {
		t.Logf("strict priority: %d passes the aging check rejects, first: %s", len(v), v[0])
	}
}
