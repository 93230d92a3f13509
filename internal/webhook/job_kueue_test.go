package webhook

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

func (j *jobWrapper) ManagedBy(m string) *jobWrapper {
	j.Spec.ManagedBy = &m
	return j
}

// TestDefaultLeavesKueueJobsToKueue: a Job that Kueue queues (or that
// another controller named in spec.managedBy starts) and that names a lock
// is not suspended, labelled or finalized by the gate (Kueue starts it once
// lockwarden's admission check holds the lock), but its containers still
// get the variables that carry the fencing token Kueue writes into the pod
// template. With the Kueue integration off, a queued Job is gated as any.
func TestDefaultLeavesKueueJobsToKueue(t *testing.T) {
	t.Parallel()
	lock := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"}}
	nightly := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "default", UID: "uid-nightly",
		Annotations: map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: "Skip"}}}
	cases := map[string]struct {
		kueue bool
		job   *batchv1.Job
		want  *batchv1.Job
	}{
		"queued by label: token variables only": {
			kueue: true,
			job:   makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").Suspend(true).Container("main").Obj(),
			want: makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").Suspend(true).
				Container("main", gateEnv("billing")...).Obj(),
		},
		"queued by annotation: token variables only": {
			kueue: true,
			job:   makeJob("j").Annotation(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want: makeJob("j").Annotation(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").
				Container("main", gateEnv("billing")...).Obj(),
		},
		"a CronJob's lock is copied onto its queued Job, for the admission check": {
			kueue: true,
			job:   makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Label(KueueQueueName, "team-a").Container("main").Obj(),
			want: makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Label(KueueQueueName, "team-a").
				Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationContention, "Skip").
				Container("main", gateEnv("billing")...).Obj(),
		},
		"a forged fencing token on a queued Job is removed": {
			kueue: true,
			job: makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").
				Annotation(locksv1alpha1.AnnotationFencingToken, "999999").TemplateAnnotation(locksv1alpha1.AnnotationFencingToken, "999999").
				TemplateAnnotation(locksv1alpha1.AnnotationHolder, "me").Container("main").Obj(),
			want: makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").
				Container("main", gateEnv("billing")...).Obj(),
		},
		"a foreign spec.managedBy (MultiKueue) is left to its controller, with or without Kueue": {
			job: makeJob("j").ManagedBy("kueue.x-k8s.io/multikueue").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want: makeJob("j").ManagedBy("kueue.x-k8s.io/multikueue").Annotation(locksv1alpha1.AnnotationLock, "billing").
				Container("main", gateEnv("billing")...).Obj(),
		},
		"spec.managedBy naming kube-controller-manager's Job controller is gated": {
			kueue: true,
			job:   makeJob("j").ManagedBy(JobControllerManagedBy).Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want:  makeJob("j").ManagedBy(JobControllerManagedBy).GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"with the Kueue integration off a queued Job is gated": {
			job:  makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want: makeJob("j").Label(KueueQueueName, "team-a").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a queued Job that names no lock is left alone": {
			kueue: true,
			job:   makeJob("j").Label(KueueQueueName, "team-a").Container("main").Obj(),
			want:  makeJob("j").Label(KueueQueueName, "team-a").Container("main").Obj(),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			objs := []client.Object{lock.DeepCopy(), nightly.DeepCopy()}
			c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(objs...).Build()
			g := &JobGate{Reader: c, APIReader: c, Kueue: tc.kueue}
			got := tc.job.DeepCopy()
			if err := g.Default(t.Context(), got); err != nil {
				t.Fatalf("Default: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Job after Default (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestDefaultRefusesAQueuedJobWithAMissingLock: leaving a Job to Kueue does
// not skip the checks of its lock.
func TestDefaultRefusesAQueuedJobWithAMissingLock(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).Build()
	g := &JobGate{Reader: c, APIReader: c, Kueue: true}
	job := makeJob("j").Label(KueueQueueName, "team-a").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj()
	err := g.Default(t.Context(), job)
	if diff := cmp.Diff([]string{"metadata.annotations[lockwarden.io/lock]"}, invalidFields(t, err)); diff != "" {
		t.Errorf("fields of the Invalid error (-want,+got):\n%s", diff)
	}
}
