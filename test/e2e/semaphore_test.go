//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestSemaphoreSampleRunsTwoAtATime applies the semaphore sample (a lock
// with maxHolders 2 and three CronJobs, with the real CronJob and Job
// controllers and kwok): over three schedule periods never more than two
// Pods run at once, two do, the third waits its turn every period, and
// every Pod has its own fencing token (a run that started after another
// ended has a larger one).
func TestSemaphoreSampleRunsTwoAtATime(t *testing.T) {
	ns := newNamespace(t, "e2e-semaphore")
	data, err := os.ReadFile(filepath.Join(cluster.Root, "config", "samples", "locks_v1alpha1_distributedlock_semaphore.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rec := recordPodsLimit(t, ns, 2)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get cronjobs,jobs,pods,dlock:\n%s", kubectl(t, "", "get", "cronjobs,jobs,pods,dlock", "-n", ns, "-o", "wide"))
		}
		rec.check(t)
	})
	kubectl(t, string(data), "apply", "-n", ns, "-f", "-")

	// While two run, the third waits in line: the lock shows 2/2 and a queue of one.
	waitFor(t, 3*time.Minute, "the lock to show both slots taken and one waiter", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "warehouse-exports")
		if err != nil {
			return false, err
		}
		return dl.Status.Slots == "2/2" && ptr.Deref(dl.Status.QueueLength, 0) == 1 && len(dl.Status.Holders) == 2 &&
			conditionStatus(dl, locksv1alpha1.ConditionHeld) == "True", nil
	})
	waitFor(t, 6*time.Minute, "runs of three schedule periods", func(context.Context) (bool, error) {
		periods := map[string]int{}
		for _, ru := range rec.finished() {
			periods[ru.schedule]++
		}
		full := 0
		for _, n := range periods {
			if n == 3 {
				full++
			}
		}
		return full >= 3, nil
	})
	if got := rec.maxConcurrent(); got != 2 {
		t.Fatalf("at most %d Pods ran at once, want 2 (maxHolders 2)", got)
	}
}
