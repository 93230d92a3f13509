//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestManualHolderWaitDoesNotReturnWhileAJobHolds is the maintenance window
// of the README: while a gated Job of the lock runs, a manual holder is set
// and `kubectl wait --for=condition=ManualHolderHeld` (the real kubectl)
// must not return; it returns once the Job finished and the manual holder
// took the lock. (Held, True for any holder of the lock, returned at once.)
func TestManualHolderWaitDoesNotReturnWhileAJobHolds(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-manual")
	if err := cluster.Client.Create(ctx, newBackendLock(ns, "billing", "billing/ledger", "")); err != nil {
		t.Fatal(err)
	}
	const runFor = 40 * time.Second
	d := runFor.String()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nightly-billing", Annotations: map[string]string{locksv1alpha1.AnnotationLock: "billing"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kwokCompleteDelay: d, kwokCompleteJitter: d}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "work", Image: "busybox:1.37", Command: []string{"true"}}},
				},
			},
		},
	}
	if err := cluster.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the Job to hold the lock", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && dl.Status.Holder != nil && dl.Status.Holder.Kind == "Job" && dl.Status.Holder.Name == job.Name &&
			conditionStatus(dl, locksv1alpha1.ConditionHeld) == metav1.ConditionTrue, err
	})

	kubectl(t, "", "patch", "dlock", "billing", "-n", ns, "--type=merge", "-p", `{"spec":{"holder":{"identity":"maintenance-by-alice"}}}`)
	waitFor(t, 30*time.Second, "the manual holder to wait in the queue", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		if err != nil {
			return false, err
		}
		c := findCondition(dl, locksv1alpha1.ConditionManualHolderHeld)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == locksv1alpha1.ReasonWaiting && c.ObservedGeneration == dl.Generation, nil
	})
	_, stderr, err := kubectlErr(t, "wait", "--for=condition=ManualHolderHeld", "dlock/billing", "-n", ns, "--timeout=5s")
	if err == nil {
		t.Fatalf("kubectl wait --for=condition=ManualHolderHeld returned while the Job holds the lock")
	}
	if !strings.Contains(stderr, "timed out") {
		t.Fatalf("kubectl wait failed for another reason than the timeout: %v\n%s", err, stderr)
	}
	// The wait above was meaningful only if the Job held throughout it.
	dl, err := getLock(ctx, ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if dl.Status.Holder == nil || dl.Status.Holder.Name != job.Name || conditionStatus(dl, locksv1alpha1.ConditionHeld) != metav1.ConditionTrue {
		t.Fatalf("after the timed-out wait the lock is held by %+v, want still the Job %s", dl.Status.Holder, job.Name)
	}

	kubectl(t, "", "wait", "--for=condition=ManualHolderHeld", "dlock/billing", "-n", ns, "--timeout=120s")
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if job.Status.Succeeded != 1 {
		t.Fatalf("the manual holder holds while the Job has not finished: status %+v", job.Status)
	}
	dl, err = getLock(ctx, ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if dl.Status.Holder == nil || dl.Status.Holder.Identity != "maintenance-by-alice" || dl.Status.FencingToken <= 0 {
		t.Fatalf("after the wait the lock is held by %+v (token %d), want maintenance-by-alice", dl.Status.Holder, dl.Status.FencingToken)
	}
}

func findCondition(dl *locksv1alpha1.DistributedLock, t string) *metav1.Condition {
	for i := range dl.Status.Conditions {
		if dl.Status.Conditions[i].Type == t {
			return &dl.Status.Conditions[i]
		}
	}
	return nil
}
