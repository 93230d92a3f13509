package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// why writes its sentences one a line; text from annotations and status in
// them cannot add lines or control the terminal.
func TestWhyLinesAreEscaped(t *testing.T) {
	var out strings.Builder
	if err := writeLines(&out, []string{"It waits behind: x\nfake\x1b[2K.", "Lock l is held by x\ny\u202e."}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "It waits behind: x\\nfake\\x1b[2K.\nLock l is held by x\\ny\\u202e.\n"; got != want {
		t.Errorf("why printed %q, want %q", got, want)
	}
}

// TestWhyNamesTheHoldWindowOrCooldownAJobWaitsFor: a Job waiting while a
// window of spec.holds is open is told the window's name and when it
// closes; one waiting while the keys cool down, until when.
func TestWhyNamesTheHoldWindowOrCooldownAJobWaitsFor(t *testing.T) {
	now := time.Date(2027, 3, 1, 2, 10, 0, 0, time.UTC)
	end := metav1.NewTime(now.Add(21 * time.Minute))
	cool := metav1.NewTime(now.Add(90 * time.Second))
	frozen := testLock("deploys", func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.Holds = []locksv1alpha1.RecurringHold{{Name: "nightly", Schedule: "1 3 * * *", DurationSeconds: 1800, TimeZone: "Europe/Berlin"}}
		dl.Status.Holder = &locksv1alpha1.HolderStatus{Identity: "hold/nightly", Kind: "DistributedLock", Namespace: ns, Name: "deploys"}
		dl.Status.FencingToken = 8
		dl.Status.ActiveHold = &locksv1alpha1.HoldWindowStatus{Name: "nightly", End: &end}
	})
	cooling := testLock("migrations", func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.CooldownSeconds = 3600
		dl.Status.Holder = &locksv1alpha1.HolderStatus{Identity: "east/team-a/Job/migrate-1/abcde", Kind: "Job", Namespace: ns, Name: "migrate-1"}
		dl.Status.FencingToken = 3
		dl.Status.CooldownUntil = &cool
	})
	suspend := true
	waiting := func(name, lock string) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute)),
				Labels:      map[string]string{locksv1alpha1.LabelLock: lock},
				Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock, locksv1alpha1.AnnotationQueuePosition: "1/1"}},
			Spec: batchv1.JobSpec{Suspend: &suspend},
		}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(frozen, cooling, waiting("deploy-7", "deploys"), waiting("migrate-2", "migrations")).Build()
	for job, want := range map[string]string{
		"deploy-7":  "A freeze window is open: hold nightly of spec.holds holds the lock until 2027-03-01T02:31:00Z (in 21m); the Job waits until the window closes.",
		"migrate-2": "The lock cools down: its last holder released it, and the keys stay held for spec.cooldownSeconds (3600s), until 2027-03-01T02:11:30Z (in 90s).",
	} {
		var out strings.Builder
		if err := why(context.Background(), c, ns, "job/"+job, &out, now); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("why job/%s does not say %q:\n%s", job, want, out.String())
		}
	}
}
