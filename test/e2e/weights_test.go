//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// weightedJob is a Job of lock exports taking weight slots, whose Pod runs
// for runFor under kwok.
func weightedJob(ns, name string, weight int, runFor time.Duration) *batchv1.Job {
	return kwokJob(ns, name, map[string]string{
		locksv1alpha1.AnnotationLock: "exports", locksv1alpha1.AnnotationWeight: strconv.Itoa(weight)}, nil, runFor)
}

// TestWeightedJobOnASemaphore: on a lock of maxHolders 4, two weight-1 Jobs
// run; a weight-3 Job arrives (two slots free, three needed) and waits, then
// four weight-1 Jobs queue behind it. The weighted Pods running never take
// more than 4 slots; no weight-1 Job behind the heavy one runs while it
// waits, although slots are free, nor acquires before it; the heavy Job
// starts once the two Jobs it found have ended. A weight above maxHolders is refused at admission.
func TestWeightedJobOnASemaphore(t *testing.T) {
	ns := newNamespace(t, "e2e-weights")
	kubectl(t, `apiVersion: locks.lockwarden.io/v1alpha1
kind: DistributedLock
metadata:
  name: exports
spec:
  keys: [warehouse/exports]
  maxHolders: 4
  backend:
    clusterBackendRef:
      name: `+devcluster.DevBackend+"\n", "apply", "-n", ns, "-f", "-")
	rec := recordPodsLimit(t, ns, 4)
	weights := map[string]int{}
	create := func(name string, weight int, runFor time.Duration) time.Time {
		t.Helper()
		weights[name] = weight
		if err := cluster.Client.Create(t.Context(), weightedJob(ns, name, weight, runFor)); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	queued := func(name string) {
		t.Helper()
		waitFor(t, time.Minute, name+" to join the queue", func(ctx context.Context) (bool, error) {
			var j batchv1.Job
			if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
				return false, err
			}
			return j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "", nil
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get jobs,pods,dlock:\n%s", kubectl(t, "", "get", "jobs,pods,dlock", "-n", ns, "-o", "wide"))
		}
	})

	if err := cluster.Client.Create(t.Context(), weightedJob(ns, "too-heavy", 5, time.Second)); err == nil || !containsAll(err.Error(), "lockwarden.io/weight", "lock exports takes 1 to 4 slots") {
		t.Fatalf("a Job of weight 5 on maxHolders 4: %v; want it refused naming the annotation and the lock's bound", err)
	}

	create("light-1", 1, 25*time.Second)
	create("light-2", 1, 25*time.Second)
	waitRun(t, rec, "light-1", 2*time.Minute)
	waitRun(t, rec, "light-2", 2*time.Minute)
	// The heavy Job and the first light one behind it run long enough to
	// be seen running together (3 + 1 slots).
	heavyCreated := create("heavy", 3, 15*time.Second)
	queued("heavy")
	for i := 3; i <= 6; i++ {
		name := fmt.Sprintf("light-%d", i)
		runFor := 5 * time.Second
		if i == 3 {
			runFor = 15 * time.Second
		}
		create(name, 1, runFor)
		queued(name)
	}
	waitFor(t, 3*time.Minute, "every Job to complete", func(ctx context.Context) (bool, error) {
		var jobs batchv1.JobList
		if err := cluster.Client.List(ctx, &jobs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range jobs.Items {
			if jobCondition(&jobs.Items[i], batchv1.JobComplete) == nil {
				return false, nil
			}
		}
		return len(jobs.Items) == 7, nil
	})
	// Every run has its own token (Pods that acquired at once may start
	// running in another order, so rec.check's order of tokens does not
	// apply to a semaphore whose slots free up together).
	runs := rec.snapshot()
	tokens := map[int64]string{}
	for _, ru := range runs {
		if ru.token == 0 || tokens[ru.token] != "" {
			t.Errorf("%s ran with token %d (also %q's)", ru.job, ru.token, tokens[ru.token])
		}
		tokens[ru.token] = ru.job
	}
	if len(runs) != 6+1 {
		t.Errorf("%d runs, want 7", len(runs))
	}

	// The slots the running Pods take, in the API server's order of events.
	type ev struct{ seq, d int }
	var evs []ev
	byJob := map[string]run{}
	for _, ru := range runs {
		byJob[ru.job] = ru
		evs = append(evs, ev{ru.start, weights[ru.job]}, ev{ru.end, -weights[ru.job]})
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.d, b.d)) })
	taken, peak := 0, 0
	for _, e := range evs {
		taken += e.d
		peak = max(peak, taken)
	}
	if peak > 4 {
		t.Errorf("the running Pods took %d slots at once, more than maxHolders 4", peak)
	}
	if peak < 4 {
		t.Errorf("the running Pods took at most %d slots at once: the heavy Job and a light one should have filled all 4", peak)
	}
	// No light Job queued behind the heavy one passed it: none ran while
	// the Jobs the heavy one found still ran (2 slots were free then), and
	// each acquired after it (a larger token). Its Pod may still start
	// running a moment before the heavy one's, when both acquired at the
	// same handover.
	heavy := byJob["heavy"]
	foundEnd := max(byJob["light-1"].end, byJob["light-2"].end)
	for i := 3; i <= 6; i++ {
		light := byJob[fmt.Sprintf("light-%d", i)]
		if light.start < foundEnd {
			t.Errorf("light-%d (weight 1, queued behind the heavy Job) ran while the heavy Job waited", i)
		}
		if light.token <= heavy.token {
			t.Errorf("light-%d acquired before the heavy Job ahead of it: token %d, the heavy Job's %d", i, light.token, heavy.token)
		}
	}
	found := byJob["light-1"].endedAt
	if l2 := byJob["light-2"].endedAt; l2.After(found) {
		found = l2
	}
	if heavy.start < foundEnd {
		t.Errorf("the heavy Job ran before both Jobs it found had ended")
	}
	t.Logf("maxHolders 4: peak %d slots; heavy (weight 3) created %v, ran %v after creation, %v after the last Job it found ended (%v after creation); light-3..6 acquired after it",
		peak, heavyCreated.Format(time.TimeOnly), heavy.startedAt.Sub(heavyCreated).Round(100*time.Millisecond),
		heavy.startedAt.Sub(found).Round(100*time.Millisecond), found.Sub(heavyCreated).Round(100*time.Millisecond))
}

// containsAll tells whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
