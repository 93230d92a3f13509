//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The concurrency sample's CronJob stops its pods within this (its
// terminationGracePeriodSeconds).
const concurrencyGrace = 10 * time.Second

// applyConcurrencySample applies the "GitHub Actions concurrency" sample as
// written (its lock, contention CancelInProgress, and its CronJob) and
// suspends the CronJob, whose runs the tests start by hand, as `kubectl
// create job --from` does.
func applyConcurrencySample(t *testing.T, ns string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cluster.Root, "config", "samples", "locks_v1alpha1_distributedlock_concurrency.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, string(data), "apply", "-n", ns, "-f", "-")
	setSuspend(t, ns, []string{"search-index-refresh"}, true)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get jobs,pods,dlock:\n%s", kubectl(t, "", "get", "jobs,pods,dlock", "-n", ns, "-o", "wide"))
			t.Logf("kubectl get events:\n%s", kubectl(t, "", "get", "events", "-n", ns))
		}
	})
}

// jobCondition returns the Job's condition of type typ when it is true.
func jobCondition(j *batchv1.Job, typ batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if c := &j.Status.Conditions[i]; c.Type == typ && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// waitJobFailed waits until the Job is Failed (kube-controller-manager's Job
// controller turned lockwarden's FailureTarget into it) and returns it.
func waitJobFailed(t *testing.T, ns, name string, timeout time.Duration) *batchv1.Job {
	t.Helper()
	j := &batchv1.Job{}
	waitFor(t, timeout, "Job "+name+" to fail", func(ctx context.Context) (bool, error) {
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, j); err != nil {
			return false, err
		}
		return jobCondition(j, batchv1.JobFailed) != nil, nil
	})
	return j
}

// eventNotes returns the notes of the Events with reason on the object name.
func eventNotes(t *testing.T, ns, name, reason string) string {
	t.Helper()
	return kubectl(t, "", "get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name+",reason="+reason,
		"-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
}

// waitRun waits until the recorder saw a Pod of the Job run and returns it.
func waitRun(t *testing.T, rec *podRecorder, job string, timeout time.Duration) run {
	t.Helper()
	var found run
	waitFor(t, timeout, "a Pod of Job "+job+" to run", func(context.Context) (bool, error) {
		i := slices.IndexFunc(rec.snapshot(), func(ru run) bool { return ru.job == job })
		if i >= 0 {
			found = rec.snapshot()[i]
		}
		return i >= 0, nil
	})
	return found
}

// TestCancelInProgressOnACronJobLane: a run of the sample's CronJob is
// started by hand while another runs; the running Job is cancelled (Failed,
// reason Cancelled, Events on it, its CronJob and the newer Job), its Pod
// stops within its grace period, and the newer Job runs only then, with a
// larger fencing token.
func TestCancelInProgressOnACronJobLane(t *testing.T) {
	ns := newNamespace(t, "e2e-cancel")
	applyConcurrencySample(t, ns)
	rec := recordPods(t, ns)

	kubectl(t, "", "create", "job", "--from=cronjob/search-index-refresh", "refresh-1", "-n", ns)
	first := waitRun(t, rec, "refresh-1", 2*time.Minute)
	kubectl(t, "", "create", "job", "--from=cronjob/search-index-refresh", "refresh-2", "-n", ns)
	created := time.Now()

	// The lock's TTL is 30 s: its holder learns it is cancelled at its next
	// renewal (10 s at most), then its pods get their grace period, within
	// the 20 s its lease has left at least.
	old := waitJobFailed(t, ns, "refresh-1", 2*time.Minute)
	failed := jobCondition(old, batchv1.JobFailed)
	if failed.Reason != locksv1alpha1.JobReasonCancelled || !strings.Contains(failed.Message, "CancelInProgress") {
		t.Fatalf("refresh-1 failed with %s: %s; want reason %s naming the contention", failed.Reason, failed.Message, locksv1alpha1.JobReasonCancelled)
	}
	second := waitRun(t, rec, "refresh-2", 2*time.Minute)
	var stopped run
	for _, ru := range rec.finished() {
		if ru.job == "refresh-1" {
			stopped = ru
		}
	}
	if stopped.endedAt.IsZero() {
		t.Fatalf("refresh-2 runs while refresh-1's Pod was never seen stopping: %+v", rec.snapshot())
	}
	target := jobCondition(old, batchv1.JobFailureTarget)
	if target == nil {
		t.Fatalf("refresh-1 has no FailureTarget condition: %+v", old.Status.Conditions)
	}
	// The grace period runs from the Pod's deletion, which the Job
	// controller makes on seeing the FailureTarget: slack for that, the
	// watch, and the condition's whole seconds. A Pod that waited for its
	// lease's TTL or for the lock would come later.
	stopIn := stopped.endedAt.Sub(target.LastTransitionTime.Time)
	if stopIn > concurrencyGrace+10*time.Second {
		t.Errorf("refresh-1's Pod stopped %v after it was cancelled, well past its grace period of %v", stopIn, concurrencyGrace)
	}
	if second.token <= first.token || second.start < stopped.end {
		t.Errorf("refresh-2 ran with token %d from event %d; refresh-1 had %d and stopped at event %d", second.token, second.start, first.token, stopped.end)
	}
	rec.check(t)

	for _, want := range []struct{ on, reason, text string }{
		{"refresh-1", locksv1alpha1.EventCancelled, "CancelInProgress"},
		{"search-index-refresh", locksv1alpha1.EventCancelled, "Job refresh-1"},
		{"refresh-2", locksv1alpha1.EventCancelling, "refresh-1"},
		{"concurrency", locksv1alpha1.EventCancelled, "refresh-1"},
	} {
		waitFor(t, 30*time.Second, fmt.Sprintf("a %s Event on %s", want.reason, want.on), func(context.Context) (bool, error) {
			return strings.Contains(eventNotes(t, ns, want.on, want.reason), want.text), nil
		})
	}
	t.Logf("CancelInProgress: refresh-1 (token %d) cancelled %v after refresh-2 was created; its Pod stopped %v after the cancel (grace %v); refresh-2 ran %v after its creation with token %d",
		first.token, target.LastTransitionTime.Sub(created).Round(time.Second), stopIn.Round(100*time.Millisecond), concurrencyGrace,
		second.startedAt.Sub(created).Round(100*time.Millisecond), second.token)
}

// replaceJob is a Job of the sample's lock in concurrency group reports,
// with contention ReplaceQueued, whose Pod runs for runFor under kwok.
func replaceJob(ns, name string, runFor time.Duration) *batchv1.Job {
	labels := map[string]string{"concurrency-group": "reports"}
	j := kwokJob(ns, name, map[string]string{
		locksv1alpha1.AnnotationLock: "concurrency", locksv1alpha1.AnnotationContention: string(locksv1alpha1.ContentionReplaceQueued)}, labels, runFor)
	j.Labels = labels
	return j
}

// TestReplaceQueuedRunsOnlyTheNewestOfFive: five Jobs with contention
// ReplaceQueued queue one after the other behind a running Job of their
// group; the older four end Failed with reason Replaced without ever
// running, and only the newest runs next.
func TestReplaceQueuedRunsOnlyTheNewestOfFive(t *testing.T) {
	ns := newNamespace(t, "e2e-replace")
	applyConcurrencySample(t, ns)
	rec := recordPods(t, ns)

	if err := cluster.Client.Create(t.Context(), replaceJob(ns, "report-0", 10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	holder := waitRun(t, rec, "report-0", 2*time.Minute)
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("report-%d", i)
		if err := cluster.Client.Create(t.Context(), replaceJob(ns, name, 2*time.Second)); err != nil {
			t.Fatal(err)
		}
		// In line (it shows its place) before the next one comes.
		waitFor(t, time.Minute, name+" to join the queue", func(ctx context.Context) (bool, error) {
			var j batchv1.Job
			if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
				return false, err
			}
			return j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "", nil
		})
	}
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("report-%d", i)
		j := waitJobFailed(t, ns, name, time.Minute)
		if c := jobCondition(j, batchv1.JobFailed); c.Reason != locksv1alpha1.JobReasonReplaced {
			t.Errorf("%s failed with %s: %s; want reason %s", name, c.Reason, c.Message, locksv1alpha1.JobReasonReplaced)
		}
		if j.Annotations[locksv1alpha1.AnnotationFencingToken] != "" || !ptr.Deref(j.Spec.Suspend, false) {
			t.Errorf("%s ran: token %q, suspend %v", name, j.Annotations[locksv1alpha1.AnnotationFencingToken], ptr.Deref(j.Spec.Suspend, false))
		}
		if notes := eventNotes(t, ns, name, locksv1alpha1.EventReplaced); !strings.Contains(notes, "Replaced in the queue of lock concurrency") {
			t.Errorf("%s: Replaced Events %q", name, notes)
		}
	}

	// The holder ends (deleted: its Pod is stopped, then the lock released);
	// the newest runs next, and it alone.
	kubectl(t, "", "delete", "job", "report-0", "-n", ns, "--wait=false")
	next := waitRun(t, rec, "report-5", 2*time.Minute)
	if next.token <= holder.token {
		t.Errorf("report-5 ran with token %d, not above the holder's %d", next.token, holder.token)
	}
	waitFor(t, time.Minute, "report-5 to complete", func(ctx context.Context) (bool, error) {
		var j batchv1.Job
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report-5"}, &j); err != nil {
			return false, err
		}
		return jobCondition(&j, batchv1.JobComplete) != nil, nil
	})
	var jobs []string
	for _, ru := range rec.snapshot() {
		jobs = append(jobs, ru.job)
	}
	if !slices.Equal(jobs, []string{"report-0", "report-5"}) {
		t.Errorf("Jobs that ran, in order: %v; want report-0 then report-5 only", jobs)
	}
	rec.check(t)
}
