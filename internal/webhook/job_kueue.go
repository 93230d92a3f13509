package webhook

import (
	batchv1 "k8s.io/api/batch/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Names other controllers give the Jobs they start.
const (
	// KueueQueueName is the label (or annotation) that hands a Job to Kueue.
	KueueQueueName = "kueue.x-k8s.io/queue-name"
	// JobControllerManagedBy is spec.managedBy of the Jobs that
	// kube-controller-manager's Job controller runs (also when it is unset).
	JobControllerManagedBy = "kubernetes.io/job-controller"
)

// ManagedElsewhere tells whether another controller than lockwarden's Job
// gate decides when the Job starts, and names it: Kueue, for a Job labelled
// (or annotated) kueue.x-k8s.io/queue-name when kueue is set, or the
// controller a Job's spec.managedBy names (MultiKueue, or any other) when it
// is not kube-controller-manager's. Such a Job is not suspended by
// lockwarden: Kueue starts it once its Workload is admitted, and lockwarden's
// admission check holds the lock before it is (controllers, Kueue admission
// check). The job-gate admission policy refuses to start it otherwise.
func ManagedElsewhere(job *batchv1.Job, kueue bool) (string, bool) {
	if m := job.Spec.ManagedBy; m != nil && *m != "" && *m != JobControllerManagedBy {
		return *m, true
	}
	if !kueue {
		return "", false
	}
	if _, ok := job.Labels[KueueQueueName]; ok {
		return "kueue", true
	}
	if _, ok := job.Annotations[KueueQueueName]; ok {
		return "kueue", true
	}
	return "", false
}

// PrepareManaged applies to a Job that another controller starts what its
// pods need from lockwarden: the lock annotation (copied from its CronJob
// when it came from there, so that the admission check reads it from the
// Job), and the environment variables that carry the fencing token, which
// Kueue writes into the pod template's annotations when it starts the Job.
// It neither suspends the Job nor labels it or adds the finalizer: those
// mark the Jobs lockwarden itself starts.
func PrepareManaged(job *batchv1.Job, lock, contention string) {
	if job.Annotations == nil {
		job.Annotations = map[string]string{}
	}
	job.Annotations[locksv1alpha1.AnnotationLock] = lock
	if contention != "" {
		job.Annotations[locksv1alpha1.AnnotationContention] = contention
	}
	// As for a gated Job: a new Job holds no lock (the job-gate policy
	// refuses a Job created with these, and Kueue merges the admission
	// check's token into the pod template only where the key is free).
	for _, k := range OperatorAnnotations {
		delete(job.Annotations, k)
		delete(job.Spec.Template.Annotations, k)
	}
	if len(job.Spec.Template.Annotations) == 0 {
		job.Spec.Template.Annotations = nil
	}
	addTokenEnv(&job.Spec.Template.Spec, lock)
}
