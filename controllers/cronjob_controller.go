package controllers

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// CronJobReconciler copies the lockwarden.io/lock, lockwarden.io/contention
// and lockwarden.io/max-wait annotations of a CronJob (as `kubectl annotate cronjob` sets them) into its
// job template. The CronJob's Jobs then carry the annotation themselves, so
// the admission webhook sees only annotated Jobs and can refuse them while it
// is down (failurePolicy Fail) without touching any other Job.
//
// It runs only with --sync-cronjob-templates: it needs the right to patch
// every CronJob in the cluster (config/rbac/cronjob_sync_role.yaml), which a
// shared operator should not hold by default.
type CronJobReconciler struct {
	client.Client
}

// The patch right on CronJobs is in the optional config/rbac/cronjob_sync_role.yaml.
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch

// Reconcile brings the job template's lock annotations in line with the CronJob's.
func (r *CronJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cj batchv1.CronJob
	if err := r.Get(ctx, req.NamespacedName, &cj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	want := syncedAnnotations(&cj)
	tmpl := cj.Spec.JobTemplate.Annotations
	if !needsSync(tmpl, want) {
		return ctrl.Result{}, nil
	}
	before := cj.DeepCopy()
	if cj.Spec.JobTemplate.Annotations == nil {
		cj.Spec.JobTemplate.Annotations = map[string]string{}
	}
	for _, k := range syncedKeys {
		if v, ok := want[k]; ok {
			cj.Spec.JobTemplate.Annotations[k] = v
		} else {
			delete(cj.Spec.JobTemplate.Annotations, k)
		}
	}
	if err := r.Patch(ctx, &cj, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("sync lock annotations into the job template: %w", err)
	}
	logf.FromContext(ctx).Info("Synced lock annotations into the job template", "lock", want[locksv1alpha1.AnnotationLock])
	return ctrl.Result{}, nil
}

// syncedAnnotations returns the job-template annotations the CronJob should
// have: its lock annotations, marked as synced; none when the CronJob has no
// lock annotation and the template's own (not synced) annotations are the user's.
func syncedAnnotations(cj *batchv1.CronJob) map[string]string {
	lock, ok := cj.Annotations[locksv1alpha1.AnnotationLock]
	if !ok {
		if cj.Spec.JobTemplate.Annotations[locksv1alpha1.AnnotationSyncedFromCronJob] != "true" {
			return nil // the user's own template annotations, if any: leave them
		}
		return map[string]string{}
	}
	want := map[string]string{locksv1alpha1.AnnotationLock: lock, locksv1alpha1.AnnotationSyncedFromCronJob: "true"}
	for _, k := range []string{locksv1alpha1.AnnotationContention, locksv1alpha1.AnnotationMaxWait, locksv1alpha1.AnnotationPriority, locksv1alpha1.AnnotationWeight} {
		if v, ok := cj.Annotations[k]; ok {
			want[k] = v
		}
	}
	return want
}

// syncedKeys are the job-template annotations the CronJobReconciler manages.
var syncedKeys = []string{locksv1alpha1.AnnotationLock, locksv1alpha1.AnnotationContention, locksv1alpha1.AnnotationMaxWait, locksv1alpha1.AnnotationPriority, locksv1alpha1.AnnotationWeight, locksv1alpha1.AnnotationSyncedFromCronJob}

func needsSync(have, want map[string]string) bool {
	if want == nil {
		return false
	}
	for _, k := range syncedKeys {
		hv, hok := have[k]
		wv, wok := want[k]
		if hok != wok || hv != wv {
			return true
		}
	}
	return false
}

// SetupWithManager registers the reconciler; it sees only CronJobs whose
// annotations or job template changed.
func (r *CronJobReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&batchv1.CronJob{}, builder.WithPredicates(predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Named("cronjob").
		Complete(r)
}
