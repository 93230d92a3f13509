package keyfrom

import (
	"context"
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// InUse lists the derived keys of dl's Jobs and Pods in this cluster
// that have not ended, sorted.
func InUse(ctx context.Context, reader client.Reader, dl *locksv1alpha1.DistributedLock) ([]string, error) {
	opts := []client.ListOption{client.InNamespace(dl.Namespace), client.MatchingLabels{locksv1alpha1.LabelLock: dl.Name}}
	seen := map[string]bool{}
	var jobs batchv1.JobList
	if err := reader.List(ctx, &jobs, opts...); err != nil {
		return nil, fmt.Errorf("list the Jobs of DistributedLock %s/%s: %w", dl.Namespace, dl.Name, err)
	}
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if k := j.Annotations[locksv1alpha1.AnnotationKey]; k != "" && !jobEnded(j) {
			seen[k] = true
		}
	}
	var pods corev1.PodList
	if err := reader.List(ctx, &pods, opts...); err != nil {
		return nil, fmt.Errorf("list the Pods of DistributedLock %s/%s: %w", dl.Namespace, dl.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if k := p.Annotations[locksv1alpha1.AnnotationKey]; k != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			seen[k] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// jobEnded tells whether a Job finished (Complete or Failed).
func jobEnded(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
