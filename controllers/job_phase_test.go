package controllers

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
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
