package controllers

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

func TestPhaseOf(t *testing.T) {
	t.Parallel()
	deleting := metav1.Now()
	finished := func(ct batchv1.JobConditionType) []batchv1.JobCondition {
		return []batchv1.JobCondition{{Type: ct, Status: corev1.ConditionTrue}}
	}
	tests := map[string]struct {
		annotations map[string]string
		conditions  []batchv1.JobCondition
		deleting    bool
		want        jobPhase
	}{
		"just gated":                {want: phaseWaiting},
		"started with a token":      {annotations: map[string]string{locksv1alpha1.AnnotationFencingToken: "7"}, want: phaseHolding},
		"lost, reported":            {annotations: map[string]string{locksv1alpha1.AnnotationFencingToken: "7", locksv1alpha1.AnnotationLost: "expired"}, want: phaseLostReported},
		"complete":                  {annotations: map[string]string{locksv1alpha1.AnnotationFencingToken: "7"}, conditions: finished(batchv1.JobComplete), want: phaseDone},
		"failed":                    {annotations: map[string]string{locksv1alpha1.AnnotationFencingToken: "7"}, conditions: finished(batchv1.JobFailed), want: phaseDone},
		"failed after a lost lease": {annotations: map[string]string{locksv1alpha1.AnnotationLost: "expired"}, conditions: finished(batchv1.JobFailed), want: phaseDone},
		"deleted while waiting":     {deleting: true, want: phaseDone},
		"complete condition false":  {conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionFalse}}, want: phaseWaiting},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}, Status: batchv1.JobStatus{Conditions: tc.conditions}}
			if tc.deleting {
				job.DeletionTimestamp = &deleting
			}
			if got := phaseOf(job); got != tc.want {
				t.Errorf("phaseOf = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestJobOrphaned: which Jobs no longer hold the lease the watchdog renews
// for their name, and so have it released.
func TestJobOrphaned(t *testing.T) {
	t.Parallel()
	leaseOf := func(uid string) *lock.Lease {
		return &lock.Lease{Holder: holder.Holder{Kind: jobKind, Namespace: "ns", Name: "nightly", UID: uid, Identity: "x"}.Encode()}
	}
	gated := func() *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "ns", UID: "uid-1",
			Labels: map[string]string{locksv1alpha1.LabelLock: "billing"}, Finalizers: []string{locksv1alpha1.Finalizer}}}
	}
	tests := map[string]struct {
		change func(*batchv1.Job)
		lease  *lock.Lease
		want   string // "" = still the holder
	}{
		"gated, holding":         {lease: leaseOf("uid-1")},
		"label removed":          {change: func(j *batchv1.Job) { delete(j.Labels, locksv1alpha1.LabelLock) }, lease: leaseOf("uid-1"), want: "lock label"},
		"finalizer removed":      {change: func(j *batchv1.Job) { j.Finalizers = nil }, lease: leaseOf("uid-1"), want: "finalizer"},
		"replaced, same name":    {lease: leaseOf("uid-0"), want: "replaced"},
		"other finalizers only":  {change: func(j *batchv1.Job) { j.Finalizers = []string{"example.com/keep"} }, lease: leaseOf("uid-1"), want: "finalizer"},
		"a second finalizer too": {change: func(j *batchv1.Job) { j.Finalizers = append(j.Finalizers, "example.com/keep") }, lease: leaseOf("uid-1")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := gated()
			if tc.change != nil {
				tc.change(job)
			}
			got := jobOrphaned(job, tc.lease)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("jobOrphaned = %q, want a reason containing %q (empty: none)", got, tc.want)
			}
		})
	}
}
