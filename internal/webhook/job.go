// Package webhook holds lockwarden's admission webhooks.
package webhook

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/keyfrom"
)

// JobGate suspends new Jobs that a lock gates, so that the Job controller
// starts them one at a time.
type JobGate struct {
	// Reader reads CronJobs and DistributedLocks (the manager's cache).
	Reader client.Reader
	// APIReader confirms a lock the cache does not have yet.
	APIReader client.Reader
	// Check, when set, decides whether the lock may use its backend and
	// scope (the Registry's Check): the same decision the controllers make,
	// so a Job whose lock is refused is refused at creation.
	Check func(ctx context.Context, dl *locksv1alpha1.DistributedLock) error
	// Kueue, when set, leaves the Jobs that Kueue queues (label or
	// annotation kueue.x-k8s.io/queue-name) to Kueue, whose admission check
	// acquires their lock (see ManagedElsewhere).
	Kueue bool
}

var _ admission.Defaulter[*batchv1.Job] = (*JobGate)(nil)

// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=priorityclasses,verbs=get

// SetupWithManager registers the webhook at /mutate-batch-v1-job.
func (g *JobGate) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &batchv1.Job{}).WithDefaulter(g).Complete()
}

// Default gates a Job that names a lock, or whose CronJob does: it suspends
// it, labels it, adds the finalizer and the environment variables that carry
// the fencing token, and copies its CronJob's maximum wait unless it has
// its own. Jobs that name no lock are left untouched.
func (g *JobGate) Default(ctx context.Context, job *batchv1.Job) error {
	log := logf.FromContext(ctx).WithName("job-gate")
	s, found, err := g.settingsOf(ctx, job)
	if err != nil || !found {
		return err
	}
	name, contention, source := s.lock, s.contention, s.source
	path := field.NewPath("metadata", "annotations")
	errs := validateAnnotations(name, contention, path, source)
	if s.hasMaxWait {
		errs = append(errs, validateMaxWait(s.maxWait, path, s.maxWaitSource)...)
	}
	if s.hasPriority {
		errs = append(errs, validatePriority(s.priority, path, s.prioritySource)...)
	}
	if s.hasWeight {
		errs = append(errs, validateWeight(s.weight, path, s.weightSource)...)
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, job.Name, errs)
	}
	lookup := lockLookup{reader: g.Reader, apiReader: g.APIReader, check: g.Check}
	jobGK := schema.GroupKind{Group: "batch", Kind: "Job"}
	dl, err := findLock(ctx, lookup, jobGK, job.Name, job.Namespace, name, path, source)
	if err != nil {
		return err
	}
	if dl != nil && locksv1alpha1.Contention(contention) == locksv1alpha1.ContentionCancelInProgress && dl.Spec.MaxHolders > 1 {
		return apierrors.NewInvalid(jobGK, job.Name, field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationContention), contention,
			fmt.Sprintf(`%s"CancelInProgress" needs a lock with maxHolders 1, and lock %s has maxHolders %d: it stops the one running holder of a key; use "ReplaceQueued" on a lock with several slots`, source, dl.Name, dl.Spec.MaxHolders))})
	}
	if err := weightFits(dl, s.weight, s.hasWeight, jobGK, job.Name, path, s.weightSource); err != nil {
		return err
	}
	w := keyfrom.Workload{Namespace: job.Namespace, Name: job.Name, GenerateName: job.GenerateName, Labels: job.Labels, Annotations: job.Annotations}
	if ref := ownerCronJob(job); ref != nil {
		w.OwnerKind, w.OwnerName = "CronJob", ref.Name
	}
	key, err := deriveKey(ctx, lookup, jobGK, job.Name, dl, w, path, source)
	if err != nil {
		return err
	}
	job.Annotations = setKey(job.Annotations, key)
	if !s.hasPriority && dl != nil && dl.Spec.Priority != nil {
		if s.priority, s.hasPriority, err = g.classPriority(ctx, job); err != nil {
			return err
		}
	}
	if s.hasPriority {
		if job.Annotations == nil {
			job.Annotations = map[string]string{}
		}
		job.Annotations[locksv1alpha1.AnnotationPriority] = s.priority
	}
	if s.hasWeight {
		if job.Annotations == nil {
			job.Annotations = map[string]string{}
		}
		job.Annotations[locksv1alpha1.AnnotationWeight] = s.weight
	}
	if by, ok := ManagedElsewhere(job, g.Kueue); ok {
		PrepareManaged(job, name, contention)
		log.V(1).Info("Prepared Job started by another controller", "job", job.Name, "generateName", job.GenerateName, "namespace", job.Namespace, "lock", name, "managedBy", by)
		return nil
	}
	Gate(job, name, contention)
	if s.hasMaxWait {
		job.Annotations[locksv1alpha1.AnnotationMaxWait] = s.maxWait
	}
	log.V(1).Info("Gated Job", "job", job.Name, "generateName", job.GenerateName, "namespace", job.Namespace, "lock", name)
	return nil
}

// Gate applies the gating mutations to a Job being created.
func Gate(job *batchv1.Job, lock, contention string) {
	if job.Labels == nil {
		job.Labels = map[string]string{}
	}
	job.Labels[locksv1alpha1.LabelLock] = lock
	// What every Job that names a lock gets (PrepareManaged: the lock's
	// annotations and token environment; a new Job never arrives holding
	// the lock, having lost or skipped it, or with a place in its queue),
	// and it is suspended until it holds the lock.
	PrepareManaged(job, lock, contention)
	suspend := true
	job.Spec.Suspend = &suspend
	controllerutil.AddFinalizer(job, locksv1alpha1.Finalizer)
}

// OperatorAnnotations are the annotations only the operator writes on a
// gated Job (and its pod template): a new Job never carries them.
var OperatorAnnotations = []string{
	locksv1alpha1.AnnotationFencingToken, locksv1alpha1.AnnotationHolder, locksv1alpha1.AnnotationLost, locksv1alpha1.AnnotationSkipped,
	locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor,
}

// withEnv sets the variables in add, replacing any of the same name.
func withEnv(have, add []corev1.EnvVar) []corev1.EnvVar {
	out := slices.DeleteFunc(slices.Clone(have), func(e corev1.EnvVar) bool {
		return slices.ContainsFunc(add, func(a corev1.EnvVar) bool { return a.Name == e.Name })
	})
	return append(out, add...)
}

// gateSettings are the lockwarden annotations that apply to a Job.
type gateSettings struct {
	lock, contention string
	// source says where lock and contention came from ("" for the Job's
	// own annotations, "on CronJob <name>: " for its CronJob's), for messages.
	source string
	// maxWait is the Job's lockwarden.io/max-wait annotation, else its
	// CronJob's (hasMaxWait: either has one); maxWaitSource says which, as
	// source does.
	maxWait, maxWaitSource string
	hasMaxWait             bool
	// priority is the Job's lockwarden.io/priority annotation, else its
	// CronJob's (hasPriority: either has one); prioritySource says which.
	priority, prioritySource string
	hasPriority              bool
	// weight is the Job's lockwarden.io/weight annotation, else its
	// CronJob's (hasWeight: either has one); weightSource says which.
	weight, weightSource string
	hasWeight            bool
}

// settingsOf finds the lock that gates job: its own annotation, or its
// owning CronJob's (the owner reference's UID must match the CronJob found),
// with the contention from the same place; and the maximum wait: the Job's
// own, else its CronJob's.
func (g *JobGate) settingsOf(ctx context.Context, job *batchv1.Job) (gateSettings, bool, error) {
	var s gateSettings
	lock, ownLock := job.Annotations[locksv1alpha1.AnnotationLock]
	maxWait, ownMaxWait := job.Annotations[locksv1alpha1.AnnotationMaxWait]
	if ownLock {
		s.lock, s.contention = lock, job.Annotations[locksv1alpha1.AnnotationContention]
	}
	if ownMaxWait {
		s.maxWait, s.hasMaxWait = maxWait, true
	}
	priority, ownPriority := job.Annotations[locksv1alpha1.AnnotationPriority]
	if ownPriority {
		s.priority, s.hasPriority = priority, true
	}
	weight, ownWeight := job.Annotations[locksv1alpha1.AnnotationWeight]
	if ownWeight {
		s.weight, s.hasWeight = weight, true
	}
	if ownLock && ownMaxWait && ownPriority && ownWeight {
		return s, true, nil
	}
	cj, err := g.ownerOf(ctx, job)
	if err != nil {
		return s, false, err
	}
	if cj != nil {
		source := fmt.Sprintf("on CronJob %s: ", cj.Name)
		if v, ok := cj.Annotations[locksv1alpha1.AnnotationLock]; ok && !ownLock {
			s.lock, s.contention, s.source, ownLock = v, cj.Annotations[locksv1alpha1.AnnotationContention], source, true
		}
		if v, ok := cj.Annotations[locksv1alpha1.AnnotationMaxWait]; ok && !ownMaxWait {
			s.maxWait, s.maxWaitSource, s.hasMaxWait = v, source, true
		}
		if v, ok := cj.Annotations[locksv1alpha1.AnnotationPriority]; ok && !ownPriority {
			s.priority, s.prioritySource, s.hasPriority = v, source, true
		}
		if v, ok := cj.Annotations[locksv1alpha1.AnnotationWeight]; ok && !ownWeight {
			s.weight, s.weightSource, s.hasWeight = v, source, true
		}
	}
	return s, ownLock, nil
}

// ownerOf returns the metadata of the Job's owning CronJob, or nil when it
// has none (or it is gone, or a CronJob of the same name that is not the
// owner). Only the metadata is read (its annotations), so the manager's
// cache keeps CronJobs as metadata only: a tenant's large CronJobs do not
// grow every replica.
func (g *JobGate) ownerOf(ctx context.Context, job *batchv1.Job) (*metav1.PartialObjectMetadata, error) {
	ref := ownerCronJob(job)
	if ref == nil {
		return nil, nil
	}
	var cj metav1.PartialObjectMetadata
	cj.SetGroupVersionKind(batchv1.SchemeGroupVersion.WithKind("CronJob"))
	if err := g.Reader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: ref.Name}, &cj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read CronJob %s/%s that owns the Job: %w", job.Namespace, ref.Name, err)
	}
	if cj.UID != ref.UID {
		return nil, nil // a CronJob of the same name, not the owner
	}
	return &cj, nil
}

// ownerCronJob returns the controlling owner reference of kind CronJob, if any.
func ownerCronJob(job *batchv1.Job) *metaOwnerRef {
	for i := range job.OwnerReferences {
		r := &job.OwnerReferences[i]
		if r.Kind == "CronJob" && r.Controller != nil && *r.Controller && schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).Group == "batch" {
			return &metaOwnerRef{Name: r.Name, UID: r.UID}
		}
	}
	return nil
}

type metaOwnerRef struct {
	Name string
	UID  types.UID
}

// validateAnnotations checks the lock and contention annotation values.
func validateAnnotations(lock, contention string, path *field.Path, source string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(lock) {
		errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationLock), lock, source+"must name a DistributedLock in the same namespace: "+msg))
	}
	if len(errs) == 0 && len(lock) > validation.LabelValueMaxLength {
		// The name becomes the value of the lockwarden.io/lock label.
		errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationLock), lock,
			fmt.Sprintf("%sa lock that gates Jobs or Pods must have a name of at most %d characters (it is stored as a label value); rename the DistributedLock", source, validation.LabelValueMaxLength)))
	}
	switch locksv1alpha1.Contention(contention) {
	case "", locksv1alpha1.ContentionQueue, locksv1alpha1.ContentionQueueLatest, locksv1alpha1.ContentionReplaceQueued,
		locksv1alpha1.ContentionCancelInProgress, locksv1alpha1.ContentionSkip:
	default:
		errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationContention), contention,
			source+`must be "Queue" (wait in FIFO order), "QueueLatest" (wait, but a CronJob keeps only its newest waiting Job), "ReplaceQueued" (wait, but a newer Job of the same key replaces the waiting ones), "CancelInProgress" (like ReplaceQueued, and also stop the running Job of the same lock) or "Skip" (do not run while the lock is held), or be left out to use the lock's spec.contention`))
	}
	return errs
}

// validatePriority checks the value of a priority annotation.
func validatePriority(priority string, path *field.Path, source string) field.ErrorList {
	if _, err := backend.ParsePriority(priority); err != nil {
		return field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationPriority), priority,
			source+"must be an integer from -2147483648 to 2147483647, higher first (for example 100), or be left out to use the pod template's priorityClassName")}
	}
	return nil
}

// validateWeight checks the value of a weight annotation.
func validateWeight(weight string, path *field.Path, source string) field.ErrorList {
	if _, err := backend.ParseWeight(weight); err != nil {
		return field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationWeight), weight,
			source+"must be an integer from 1 to the lock's maxHolders (the slots the workload takes, for example 3), or be left out for 1")}
	}
	return nil
}

// weightFits refuses a weight above the maxHolders of lock dl (nil: not
// known yet), naming the annotation, the lock and its maxHolders.
func weightFits(dl *locksv1alpha1.DistributedLock, weight string, has bool, gk schema.GroupKind, name string, path *field.Path, source string) error {
	if dl == nil || !has {
		return nil
	}
	w, err := backend.ParseWeight(weight)
	if err != nil {
		return nil // refused by validateWeight
	}
	if limit := max(int(dl.Spec.MaxHolders), 1); w > limit {
		return apierrors.NewInvalid(gk, name, field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationWeight), weight,
			fmt.Sprintf("%sa workload of lock %s takes 1 to %d slots (its maxHolders): lower the weight or raise the lock's maxHolders", source, dl.Name, limit))})
	}
	return nil
}

// classPriority is the priority of a Job's pod template: its
// spec.priority when set, else the value of the PriorityClass its
// priorityClassName names (read once, at admission, so the controller
// never needs to watch PriorityClasses). ok is false when it names none;
// a class that does not exist is an error the Job's creator sees, as
// the Pods' own admission would refuse them.
func (g *JobGate) classPriority(ctx context.Context, job *batchv1.Job) (string, bool, error) {
	spec := job.Spec.Template.Spec
	if spec.Priority != nil {
		return strconv.FormatInt(int64(*spec.Priority), 10), true, nil
	}
	if spec.PriorityClassName == "" {
		return "", false, nil
	}
	reader := g.APIReader
	if reader == nil {
		reader = g.Reader
	}
	var pc schedulingv1.PriorityClass
	if err := reader.Get(ctx, types.NamespacedName{Name: spec.PriorityClassName}, &pc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, job.Name, field.ErrorList{
				field.NotFound(field.NewPath("spec", "template", "spec", "priorityClassName"), spec.PriorityClassName)})
		}
		return "", false, fmt.Errorf("read PriorityClass %s of the Job's pod template: %w", spec.PriorityClassName, err)
	}
	return strconv.FormatInt(int64(pc.Value), 10), true, nil
}

// validateMaxWait checks the value of a max-wait annotation.
func validateMaxWait(maxWait string, path *field.Path, source string) field.ErrorList {
	if d, err := time.ParseDuration(maxWait); err != nil || d <= 0 {
		return field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationMaxWait), maxWait,
			source+`must be a positive duration such as "45m", "2h" or "1h30m" (units s, m, h), or be left out to use the lock's spec.maxWaitSeconds`)}
	}
	return nil
}

// getLock reads a lock from the cache, then from the API server (the cache
// may lag behind a lock created a moment ago). It returns nil when there is
// no such lock; err is a failure to read.
func getLock(ctx context.Context, reader, apiReader client.Reader, namespace, name string) (*locksv1alpha1.DistributedLock, error) {
	nn := types.NamespacedName{Namespace: namespace, Name: name}
	var dl locksv1alpha1.DistributedLock
	err := reader.Get(ctx, nn, &dl)
	if apierrors.IsNotFound(err) && apiReader != nil {
		err = apiReader.Get(ctx, nn, &dl)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &dl, nil
}
