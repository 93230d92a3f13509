package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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

// PodGate gates new Pods that name a lock (the annotation lockwarden.io/lock,
// usually from their workload's pod template): they are created with a
// scheduling gate and stay Pending until the Pod controller acquires the
// lock for them (or for their workload) and removes it.
type PodGate struct {
	// Reader reads DistributedLocks (the manager's cache).
	Reader client.Reader
	// APIReader reads the Pod's ReplicaSet (to find its Deployment) and
	// confirms a lock the cache does not have yet.
	APIReader client.Reader
	// Check, when set, decides whether the lock may use its backend and
	// scope, as for Jobs.
	Check func(ctx context.Context, dl *locksv1alpha1.DistributedLock) error
}

var _ admission.Defaulter[*corev1.Pod] = (*PodGate)(nil)

// +kubebuilder:rbac:groups=apps,resources=replicasets;statefulsets,verbs=get

// SetupWithManager registers the webhook at /mutate--v1-pod.
func (g *PodGate) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &corev1.Pod{}).WithDefaulter(g).Complete()
}

var podGK = schema.GroupKind{Kind: "Pod"}

// OperatorPodAnnotations are the annotations only the operator writes on a
// gated Pod: a new Pod never carries them (a Pod copied from a running one
// would claim its token).
var OperatorPodAnnotations = []string{
	locksv1alpha1.AnnotationFencingToken, locksv1alpha1.AnnotationHolder, locksv1alpha1.AnnotationLost,
	locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor, locksv1alpha1.AnnotationWorkload,
}

// Default gates a Pod that names a lock: it adds the scheduling gate, the
// lock label, the finalizer and the environment variables that carry the
// fencing token, records its workload and its holder mode. Pods of Jobs are
// the Job gate's (their Job holds the lock); Pods that name no lock are
// left untouched.
func (g *PodGate) Default(ctx context.Context, pod *corev1.Pod) error {
	name, ok := pod.Annotations[locksv1alpha1.AnnotationLock]
	if !ok || controlledBy(pod.OwnerReferences, "batch", "Job") != nil {
		return nil
	}
	path := field.NewPath("metadata", "annotations")
	mode := locksv1alpha1.HolderMode(pod.Annotations[locksv1alpha1.AnnotationHolderMode])
	if mode == "" {
		mode = locksv1alpha1.HolderModePod
	}
	errs := validateAnnotations(name, "", path, "")
	errs = append(errs, validatePodAnnotations(pod.Annotations, path, "")...)
	workload, err := g.workloadOf(ctx, pod)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if mode == locksv1alpha1.HolderModeWorkload && workload == "" {
		errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationHolderMode), string(mode),
			`a Pod that no Deployment, StatefulSet or ReplicaSet controls holds the lock for itself: use "Pod" (or leave the annotation out), or create the Pod through a workload`))
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(podGK, podName(pod), errs)
	}
	lookup := lockLookup{reader: g.Reader, apiReader: g.APIReader, check: g.Check}
	dl, err := findLock(ctx, lookup, podGK, podName(pod), pod.Namespace, name, path, "")
	if err != nil {
		return err
	}
	weight, hasWeight := pod.Annotations[locksv1alpha1.AnnotationWeight]
	if err := weightFits(dl, weight, hasWeight, podGK, podName(pod), path, ""); err != nil {
		return err
	}
	ownerKind, ownerName, _ := strings.Cut(workload, "/")
	ownerName, _, _ = strings.Cut(ownerName, "/")
	key, err := deriveKey(ctx, lookup, podGK, podName(pod), dl, keyfrom.Workload{
		Namespace: pod.Namespace, Name: pod.Name, GenerateName: pod.GenerateName, Labels: pod.Labels, Annotations: pod.Annotations,
		OwnerKind: ownerKind, OwnerName: ownerName,
	}, path, "")
	if err != nil {
		return err
	}
	GatePod(pod, name, mode, workload)
	pod.Annotations = setKey(pod.Annotations, key)
	logf.FromContext(ctx).WithName("pod-gate").V(1).Info("Gated Pod", "pod", pod.Name, "generateName", pod.GenerateName, "namespace", pod.Namespace, "lock", name, "mode", mode, "workload", workload)
	return nil
}

// podName is the Pod's name for messages: its generateName while it has none.
func podName(pod *corev1.Pod) string {
	if pod.Name == "" {
		return pod.GenerateName
	}
	return pod.Name
}

// GatePod applies the gating mutations to a Pod being created.
func GatePod(pod *corev1.Pod, lock string, mode locksv1alpha1.HolderMode, workload string) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[locksv1alpha1.LabelLock] = lock
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for _, k := range OperatorPodAnnotations {
		delete(pod.Annotations, k)
	}
	pod.Annotations[locksv1alpha1.AnnotationHolderMode] = string(mode)
	if workload != "" {
		pod.Annotations[locksv1alpha1.AnnotationWorkload] = workload
	}
	if !slices.ContainsFunc(pod.Spec.SchedulingGates, func(s corev1.PodSchedulingGate) bool { return s.Name == locksv1alpha1.SchedulingGate }) {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1alpha1.SchedulingGate})
	}
	controllerutil.AddFinalizer(pod, locksv1alpha1.Finalizer)
	addTokenEnv(&pod.Spec, lock)
}

// addTokenEnv gives every container of spec the variables that carry the
// fencing token and holder (from the Pod's annotations, through the downward
// API: read when the container starts, after lockwarden wrote them) and the
// lock's name.
func addTokenEnv(spec *corev1.PodSpec, lock string) {
	env := []corev1.EnvVar{
		{Name: locksv1alpha1.EnvFencingToken, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + locksv1alpha1.AnnotationFencingToken + "']"}}},
		{Name: locksv1alpha1.EnvHolder, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + locksv1alpha1.AnnotationHolder + "']"}}},
		{Name: locksv1alpha1.EnvLock, Value: lock},
	}
	for i := range spec.InitContainers {
		spec.InitContainers[i].Env = withEnv(spec.InitContainers[i].Env, env)
	}
	for i := range spec.Containers {
		spec.Containers[i].Env = withEnv(spec.Containers[i].Env, env)
	}
}

// validatePodAnnotations checks the holder-mode, handover, priority and
// weight annotations.
func validatePodAnnotations(annotations map[string]string, path *field.Path, source string) field.ErrorList {
	var errs field.ErrorList
	if v, ok := annotations[locksv1alpha1.AnnotationHolderMode]; ok {
		switch locksv1alpha1.HolderMode(v) {
		case locksv1alpha1.HolderModePod, locksv1alpha1.HolderModeWorkload:
		default:
			errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationHolderMode), v,
				source+`must be "Pod" (each Pod holds the lock: maxHolders caps the running Pods) or "Workload" (the Deployment or StatefulSet holds it once for all its Pods), or be left out for "Pod"`))
		}
	}
	if v, ok := annotations[locksv1alpha1.AnnotationHandover]; ok && v != locksv1alpha1.HandoverTerminating {
		errs = append(errs, field.Invalid(path.Key(locksv1alpha1.AnnotationHandover), v,
			source+`must be "Terminating" (a Pod releases its lease when it starts terminating), or be left out (it releases when it is gone)`))
	}
	if v, ok := annotations[locksv1alpha1.AnnotationPriority]; ok {
		errs = append(errs, validatePriority(v, path, source)...)
	}
	if v, ok := annotations[locksv1alpha1.AnnotationWeight]; ok {
		errs = append(errs, validateWeight(v, path, source)...)
	}
	return errs
}

// workloadOf names the workload that controls pod, Kind/name/uid: its
// StatefulSet, its ReplicaSet's Deployment, or its ReplicaSet. It is "" for
// a Pod no workload controls, or whose owner reference names no existing
// workload (a missing owner, or another UID than the one of that name).
func (g *PodGate) workloadOf(ctx context.Context, pod *corev1.Pod) (string, error) {
	reader := g.APIReader
	if reader == nil {
		reader = g.Reader
	}
	// The owner as it exists: an owner reference names any UID its writer
	// chose, and the workload it claims must be the one of that name.
	get := func(kind, name string) (*metav1.PartialObjectMetadata, error) {
		var o metav1.PartialObjectMetadata
		o.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind(kind))
		if err := reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, &o); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("read %s %s/%s that controls the Pod: %w", kind, pod.Namespace, name, err)
		}
		return &o, nil
	}
	if ref := controlledBy(pod.OwnerReferences, "apps", "StatefulSet"); ref != nil {
		sts, err := get("StatefulSet", ref.Name)
		if err != nil || sts == nil || sts.UID != ref.UID {
			return "", err
		}
		return workloadName("StatefulSet", ref.Name, ref.UID), nil
	}
	ref := controlledBy(pod.OwnerReferences, "apps", "ReplicaSet")
	if ref == nil {
		return "", nil
	}
	rs, err := get("ReplicaSet", ref.Name)
	if err != nil || rs == nil || rs.UID != ref.UID {
		return "", err
	}
	if d := controlledBy(rs.OwnerReferences, "apps", "Deployment"); d != nil {
		return workloadName("Deployment", d.Name, d.UID), nil
	}
	return workloadName("ReplicaSet", ref.Name, ref.UID), nil
}

// workloadName is the value of the workload annotation.
func workloadName(kind, name string, uid types.UID) string {
	return kind + "/" + name + "/" + string(uid)
}

// controlledBy returns the controlling owner reference of the kind in group.
func controlledBy(refs []metav1.OwnerReference, group, kind string) *metav1.OwnerReference {
	for i := range refs {
		r := &refs[i]
		if r.Kind == kind && r.Controller != nil && *r.Controller && schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).Group == group {
			return r
		}
	}
	return nil
}

// lockLookup reads the lock a gated object names and applies the backend policy.
type lockLookup struct {
	reader, apiReader client.Reader
	check             func(ctx context.Context, dl *locksv1alpha1.DistributedLock) error
}

// findLock returns nil when the DistributedLock namespace/name exists and
// may be used, else the admission error that refuses the object (invalid
// for the user's mistakes, internal when the lock cannot be read).
func findLock(ctx context.Context, l lockLookup, gk schema.GroupKind, objName, namespace, name string, path *field.Path, source string) (*locksv1alpha1.DistributedLock, error) {
	dl, err := getLock(ctx, l.reader, l.apiReader, namespace, name)
	if err != nil {
		// Not the user's mistake: refuse for now, so the creation is retried.
		return nil, apierrors.NewInternalError(fmt.Errorf("read DistributedLock %s/%s: %w", namespace, name, err))
	}
	if dl == nil {
		return nil, apierrors.NewInvalid(gk, objName, field.ErrorList{
			field.Invalid(path.Key(locksv1alpha1.AnnotationLock), name, fmt.Sprintf("%sno DistributedLock %q in namespace %q: create it, or name an existing lock", source, name, namespace)),
		})
	}
	if l.check == nil {
		return dl, nil
	}
	var pe *backend.PolicyError
	switch err := l.check(ctx, dl); {
	case errors.As(err, &pe):
		return nil, apierrors.NewInvalid(gk, objName, field.ErrorList{
			field.Invalid(path.Key(locksv1alpha1.AnnotationLock), name, fmt.Sprintf("%sDistributedLock %q cannot be used: %s", source, name, pe.Error())),
		})
	case err != nil:
		return nil, apierrors.NewInternalError(fmt.Errorf("check the backend of DistributedLock %s/%s: %w", namespace, name, err))
	}
	return dl, nil
}
