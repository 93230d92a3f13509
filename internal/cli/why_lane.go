package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// maxWaitersNamed bounds how many of a lane's waiters why names.
const maxWaitersNamed = 5

// laneArg is the lock that why ARG --key KEY names: LOCK or lock/LOCK. A
// Job or a Pod has no lanes; why explains those without --key.
func laneArg(arg, key string) (string, error) {
	kind, name, typed := strings.Cut(arg, "/")
	if !typed {
		kind, name = "lock", arg
	}
	switch k := kindOf(kind); {
	case (k == kindJob || k == kindPod) && name != "":
		what := "a Job"
		if k == kindPod {
			what = "a Pod"
		}
		return "", fmt.Errorf("--key %q explains a lane of a lock, and %s is %s: run why %s without --key, or name the lock: why LOCK --key %s", key, arg, what, arg, key)
	case k != kindLock || name == "":
		return "", fmt.Errorf("--key %q explains a lane of a lock: name the lock as LOCK or lock/LOCK, not %q", key, arg)
	}
	return name, nil
}

// whyLane explains why the Jobs and Pods of the lane key of lock name
// wait.
func whyLane(ctx context.Context, c client.Client, ns, name, key string, out io.Writer, now time.Time) error {
	v, err := readLane(ctx, c, ns, name, key)
	if err != nil {
		return err
	}
	return writeLines(out, v.explain(now))
}

// explain is why the lane's waiters wait, one sentence a line: who waits
// and in which order, whom they wait behind, who holds the lane, its
// queue, the cooldown, then the lock and its backend. A lock with keyFrom
// has no spec.holds (the API refuses them), so no freeze window applies.
func (v *laneView) explain(now time.Time) []string {
	dl := v.lock
	var lines []string
	say := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	if v.idle() {
		say("%s", v.nothingHere())
		whyLaneLock(say, dl, now)
		return lines
	}
	ref := fmt.Sprintf("key %s of lock %s", v.key, dl.Name)
	if len(v.waiters) == 0 {
		say("Nothing of this namespace waits for %s.", ref)
		if b := v.busiest; b != nil && b.Waiting > 0 {
			say("status.lanes counts %d waiting: in another cluster, or through another lock that derives the same key.", b.Waiting)
		}
	} else {
		named := make([]string, 0, min(len(v.waiters), maxWaitersNamed)+1)
		for _, w := range v.waiters[:min(len(v.waiters), maxWaitersNamed)] {
			named = append(named, w.object+w.place())
		}
		if more := len(v.waiters) - len(named); more > 0 {
			named = append(named, fmt.Sprintf("and %d more", more))
		}
		say("%d Job(s) or Pod(s) of this namespace wait for %s, in this order: %s.", len(v.waiters), ref, strings.Join(named, ", "))
		first := v.waiters[0]
		say("The first, %s, has waited %s, since it was created.", first.object, humanSince(now, first.since))
		if first.waitingFor != "" {
			say("It waits behind: %s (%s).", first.waitingFor, locksv1alpha1.AnnotationWaitingFor)
		}
	}
	v.explainHolders(say, now)
	if len(v.waiters) > 0 && dl.Spec.CooldownSeconds > 0 {
		say("After each release the key stays held for spec.cooldownSeconds (%ds): the first waiter starts that long after the holder is done, and status.lanes counts the cooling lease as a holder.", dl.Spec.CooldownSeconds)
	}
	whyLaneLock(say, dl, now)
	return lines
}

// whyLaneLock says what the lock reports for all its lanes, and why its
// backend cannot be used: then what status.lanes shows is the last
// observed.
func whyLaneLock(say func(string, ...any), dl *locksv1alpha1.DistributedLock, now time.Time) {
	say("Lock %s (keys %s) %s.", dl.Name, lockKeys(dl), lockIs(dl, now))
	if p := backendProblem(dl); p != "" {
		say("%s", p)
		say("Until it answers, no waiter of any lane gets its turn, and status.lanes shows what the operator last observed.")
	}
}

// explainHolders says who holds the lane and how long its queue is.
func (v *laneView) explainHolders(say func(string, ...any), now time.Time) {
	b := v.busiest
	switch {
	case len(v.holders) > 0:
		held := make([]string, 0, len(v.holders))
		for _, h := range v.holders {
			held = append(held, h.describe(now))
		}
		say("Key %s is held by %s.", v.key, strings.Join(held, "; "))
	case b != nil && b.Holders > 0:
		say("No Job or Pod of this namespace holds key %s: status.lanes counts %d holder(s) (newest fencing token %d), %s.", v.key, b.Holders, b.FencingToken, v.heldElsewhere())
	case b != nil:
		say("Nothing holds key %s (status.lanes counts 0 holding): the first waiter gets it once the operator hands it over.", v.key)
	default:
		say("No Job or Pod of this namespace holds key %s, and status.lanes has no counts for it (it is not among the busiest keys).", v.key)
	}
	switch {
	case b != nil:
		say("Its queue holds %d waiter(s) (status.lanes.busiest, in every cluster sharing the store).", b.Waiting)
	case len(v.waiters) > 0 && v.waiters[0].length > 0:
		say("Its queue holds %d waiter(s) (%s).", v.waiters[0].length, locksv1alpha1.AnnotationQueuePosition)
	case len(v.waiters) > 0:
		say("The operator has not placed them in its queue yet (no %s annotation).", locksv1alpha1.AnnotationQueuePosition)
	}
}

// describe is a holder as a sentence shows it: identity, the Jobs or Pods
// that hold it, fencing token and for how long.
func (h laneHolder) describe(now time.Time) string {
	objects := strings.Join(h.objects, ", ")
	s := objects
	if h.identity != "" {
		s = fmt.Sprintf("%s (%s)", h.identity, objects)
	}
	s += " with fencing token " + h.fence
	switch {
	case h.since.IsZero():
	case len(h.objects) > 1:
		s += fmt.Sprintf(", for %s since the first of them started", humanSince(now, h.since))
	default:
		s += fmt.Sprintf(", for %s since %s", humanSince(now, h.since), h.started)
	}
	return s
}
