//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestFreezeWindowHoldsJobsUntilItCloses applies the freeze sample as
// written (the operator shows its next window), then a lock whose window
// opens at the next minute of Berlin's clock, for a minute: once it is
// open, a Job created in it stays suspended, and its Pod starts only after
// the window's end, with a fencing token above the hold's.
func TestFreezeWindowHoldsJobsUntilItCloses(t *testing.T) {
	ns := newNamespace(t, "e2e-freeze")
	data, err := os.ReadFile(filepath.Join(cluster.Root, "config", "samples", "locks_v1alpha1_distributedlock_freeze.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, string(data), "apply", "-n", ns, "-f", "-")
	waitFor(t, time.Minute, "the sample lock to show its next window", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "deploys")
		return err == nil && dl.Status.NextHold != nil && dl.Status.NextHold.Start != nil, err
	})

	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// The next whole minute at least 15 s away, on Berlin's clock.
	opens := time.Now().In(berlin).Add(15 * time.Second).Truncate(time.Minute).Add(time.Minute)
	dl := newLock(ns, "window", "window", "")
	dl.Spec.Holds = []locksv1alpha1.RecurringHold{{Name: "soon", Schedule: fmt.Sprintf("%d %d * * *", opens.Minute(), opens.Hour()),
		DurationSeconds: 60, TimeZone: "Europe/Berlin"}}
	if err := cluster.Client.Create(t.Context(), dl); err != nil {
		t.Fatal(err)
	}
	var window locksv1alpha1.HoldWindowStatus
	var holdToken int64
	waitFor(t, 2*time.Minute, "the window to open and its hold to hold the lock", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "window")
		if err != nil || dl.Status.ActiveHold == nil || dl.Status.ActiveHold.End == nil || conditionStatus(dl, locksv1alpha1.ConditionHoldActive) != "True" {
			return false, err
		}
		window, holdToken = *dl.Status.ActiveHold, dl.Status.FencingToken
		return true, nil
	})
	t.Logf("window %s open from %s to %s (Berlin %s), hold token %d", window.Name, window.Start.UTC().Format(time.RFC3339),
		window.End.UTC().Format(time.RFC3339), window.Start.In(berlin).Format("15:04"), holdToken)
	if !window.Start.Time.Equal(opens) {
		t.Errorf("the window opened at %s, want %s (the schedule read in Europe/Berlin)", window.Start.UTC(), opens.UTC())
	}
	if window.End.Sub(window.Start.Time) != time.Minute {
		t.Errorf("the window lasts %v, want 1m", window.End.Sub(window.Start.Time))
	}

	rec := recordPods(t, ns)
	t.Cleanup(func() { rec.check(t) })
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deploy", Annotations: map[string]string{locksv1alpha1.AnnotationLock: "window"}},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kwokCompleteDelay: "1s", kwokCompleteJitter: "1s"}},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "deploy", Image: "busybox:1.37", Command: []string{"true"}}}},
		}},
	}
	if err := cluster.Client.Create(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if !created.Before(window.End.Time) {
		t.Fatalf("the Job was created at %s, after the window closed at %s", created.UTC(), window.End.UTC())
	}
	waitFor(t, 3*time.Minute, "the Job to run once the window closed", func(ctx context.Context) (bool, error) {
		var j batchv1.Job
		if err := cluster.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "deploy"}, &j); err != nil {
			return false, err
		}
		return finished(&j), nil
	})
	runs := rec.snapshot()
	if len(runs) != 1 {
		t.Fatalf("%d runs, want 1", len(runs))
	}
	if runs[0].startedAt.Before(window.End.Time) {
		t.Errorf("the Job's Pod started at %s, before the window closed at %s", runs[0].startedAt.UTC(), window.End.UTC())
	}
	if runs[0].token <= holdToken {
		t.Errorf("the Job ran with fencing token %d, not above the hold's %d", runs[0].token, holdToken)
	}
	t.Logf("the Job created %s before the window closed started %s after it, with token %d (hold %d)",
		window.End.Sub(created).Round(time.Millisecond), runs[0].startedAt.Sub(window.End.Time).Round(time.Millisecond), runs[0].token, holdToken)
}
