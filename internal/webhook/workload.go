package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// WorkloadPath is where WorkloadGate is served.
const WorkloadPath = "/mutate-apps-v1-workload"

// WorkloadGate prepares Deployments and StatefulSets that name a lock: it
// copies the lock annotations of the workload itself (`kubectl annotate
// deployment`) into its pod template, where the Pods it creates carry them
// to the Pod gate, and warns when the workload's update strategy cannot
// roll out under the lock (a rolling update that keeps every old Pod until
// a new one is ready, while the old Pods hold every slot).
type WorkloadGate struct {
	// Reader reads DistributedLocks (the manager's cache).
	Reader client.Reader
	// APIReader confirms a lock the cache does not have yet.
	APIReader client.Reader
}

// SetupWithManager registers the webhook at WorkloadPath.
func (g *WorkloadGate) SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(WorkloadPath, &admission.Webhook{Handler: g})
}

// workloadAnnotations are the annotations copied from a workload into its pod template.
var workloadAnnotations = []string{locksv1alpha1.AnnotationLock, locksv1alpha1.AnnotationHolderMode, locksv1alpha1.AnnotationHandover}

// Handle copies the workload's lock annotations into its pod template and
// returns the warnings about its strategy.
func (g *WorkloadGate) Handle(ctx context.Context, req admission.Request) admission.Response {
	var (
		meta     *metav1.ObjectMeta
		template *corev1.PodTemplateSpec
		obj      any
	)
	switch req.Kind.Kind {
	case "Deployment":
		d := &appsv1.Deployment{}
		if err := json.Unmarshal(req.Object.Raw, d); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		meta, template, obj = &d.ObjectMeta, &d.Spec.Template, d
	case "StatefulSet":
		s := &appsv1.StatefulSet{}
		if err := json.Unmarshal(req.Object.Raw, s); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		meta, template, obj = &s.ObjectMeta, &s.Spec.Template, s
	default:
		return admission.Allowed("")
	}
	gk := schema.GroupKind{Group: "apps", Kind: req.Kind.Kind}
	syncTemplate(meta, template)
	lockName, ok := template.Annotations[locksv1alpha1.AnnotationLock]
	if !ok {
		return patched(req, obj, nil)
	}
	path := field.NewPath("spec", "template", "metadata", "annotations")
	errs := validateAnnotations(lockName, "", path, "")
	errs = append(errs, validatePodAnnotations(template.Annotations, path, "")...)
	if len(errs) > 0 {
		return admission.Denied(apierrors.NewInvalid(gk, meta.Name, errs).Error())
	}
	dl, err := getLock(ctx, g.Reader, g.APIReader, req.Namespace, lockName)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("read DistributedLock %s/%s: %w", req.Namespace, lockName, err))
	}
	var warnings []string
	if dl == nil {
		warnings = append(warnings, fmt.Sprintf("no DistributedLock %q in namespace %q: the %s's Pods are refused until it exists", lockName, req.Namespace, req.Kind.Kind))
	} else {
		warnings = rolloutWarnings(obj, dl)
	}
	if w := newlyGated(req, obj, lockName); w != "" {
		warnings = append(warnings, w)
	}
	return patched(req, obj, warnings)
}

// newlyGated warns when an update puts an existing workload under a lock:
// its running Pods were never gated and hold nothing, so until they are
// replaced they run beside the new Pods that hold the lock.
func newlyGated(req admission.Request, obj any, lockName string) string {
	if len(req.OldObject.Raw) == 0 {
		return ""
	}
	var old struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil || old.Spec.Template.Annotations[locksv1alpha1.AnnotationLock] != "" {
		return ""
	}
	if d, ok := obj.(*appsv1.Deployment); ok && d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return "" // the old Pods stop before the first new one starts
	}
	return fmt.Sprintf("%s %s now names lock %s: this starts a rollout, and its current Pods, never gated, hold nothing and run beside the new Pods that hold the lock until they are replaced. "+
		"For a workload that must never run twice, scale it to 0 first (or use strategy Recreate), then annotate it", req.Kind.Kind, req.Name, lockName)
}

// syncTemplate copies the workload's own lock annotations into its pod
// template, remembering which (AnnotationSyncedFromWorkload), so that the
// ones later removed from the workload are removed from the template too.
// Annotations the template carries itself are never removed.
func syncTemplate(meta *metav1.ObjectMeta, template *corev1.PodTemplateSpec) {
	var synced []string
	if s := template.Annotations[locksv1alpha1.AnnotationSyncedFromWorkload]; s != "" {
		synced = strings.Split(s, ",")
	}
	var now []string
	for _, k := range workloadAnnotations {
		v, ok := meta.Annotations[k]
		switch {
		case ok:
			if template.Annotations == nil {
				template.Annotations = map[string]string{}
			}
			if _, own := template.Annotations[k]; own && !slices.Contains(synced, k) {
				continue // the template's own value wins
			}
			template.Annotations[k] = v
			now = append(now, k)
		case slices.Contains(synced, k):
			delete(template.Annotations, k)
		}
	}
	if len(now) > 0 {
		template.Annotations[locksv1alpha1.AnnotationSyncedFromWorkload] = strings.Join(now, ",")
	} else {
		delete(template.Annotations, locksv1alpha1.AnnotationSyncedFromWorkload)
	}
}

// patched returns the response that turns the request's object into obj.
func patched(req admission.Request, obj any, warnings []string) admission.Response {
	raw, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	resp.Warnings = warnings
	return resp
}

// rolloutWarnings explains how a workload whose Pods each hold dl (holder
// mode Pod) stops rolling out: a Deployment's rolling update keeps
// replicas-maxUnavailable Pods available, and only the maxHolders Pods that
// hold can be; a StatefulSet's rolling update waits for each new Pod to be
// ready. Workload mode shares one lease among all the Pods and has neither
// problem.
func rolloutWarnings(obj any, dl *locksv1alpha1.DistributedLock) []string {
	holders := max(int(dl.Spec.MaxHolders), 1)
	switch w := obj.(type) {
	case *appsv1.Deployment:
		if mode(w.Spec.Template.Annotations) != locksv1alpha1.HolderModePod || w.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
			return nil
		}
		replicas := int(ptr.Deref(w.Spec.Replicas, 1))
		unavailable := RolloutMaxUnavailable(w)
		if need := replicas - holders + 1; unavailable < need {
			return []string{fmt.Sprintf("Deployment %s: each Pod holds lock %s (maxHolders %d), so at most %d of its %d Pods are ever available; "+
				"a rolling update with maxUnavailable %d waits for a new Pod to become available before it removes an old one, while the old Pods hold the lock: the rollout stops. "+
				"Use strategy Recreate, set spec.strategy.rollingUpdate.maxUnavailable to at least %d, or hold the lock per workload (annotation %s: %s). "+
				"With one of the first two, annotation %s: %s also lets each new Pod start while the old one it replaces is still terminating",
				w.Name, dl.Name, holders, min(holders, replicas), replicas, unavailable, max(need, 1),
				locksv1alpha1.AnnotationHolderMode, locksv1alpha1.HolderModeWorkload, locksv1alpha1.AnnotationHandover, locksv1alpha1.HandoverTerminating)}
		}
	case *appsv1.StatefulSet:
		if mode(w.Spec.Template.Annotations) != locksv1alpha1.HolderModePod {
			return nil
		}
		replicas := int(ptr.Deref(w.Spec.Replicas, 1))
		if replicas <= holders {
			return nil
		}
		var out []string
		if w.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
			out = append(out, fmt.Sprintf("StatefulSet %s: each Pod holds lock %s (maxHolders %d) and podManagementPolicy is OrderedReady: Pod %d waits for the lock and never becomes ready, "+
				"so the Pods after it are never created. Use podManagementPolicy Parallel, or hold the lock per workload (annotation %s: %s)",
				w.Name, dl.Name, holders, holders, locksv1alpha1.AnnotationHolderMode, locksv1alpha1.HolderModeWorkload))
		}
		if w.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
			out = append(out, fmt.Sprintf("StatefulSet %s: a rolling update waits for each updated Pod to become ready, and the Pods beyond the first %d wait for lock %s: "+
				"the update stops. Use updateStrategy OnDelete, or hold the lock per workload (annotation %s: %s)",
				w.Name, holders, dl.Name, locksv1alpha1.AnnotationHolderMode, locksv1alpha1.HolderModeWorkload))
		}
		return out
	}
	return nil
}

// RolloutMaxUnavailable is how many Pods a Deployment's rolling update may
// take down, as the Deployment controller resolves it (a percentage of the
// replicas rounded down; 0 when maxSurge is 0 too is raised to 1, as the
// API requires one of them to be positive).
func RolloutMaxUnavailable(d *appsv1.Deployment) int {
	replicas := int(ptr.Deref(d.Spec.Replicas, 1))
	unavailable := intstr.FromString("25%")
	surge := intstr.FromString("25%")
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		if ru.MaxUnavailable != nil {
			unavailable = *ru.MaxUnavailable
		}
		if ru.MaxSurge != nil {
			surge = *ru.MaxSurge
		}
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(&unavailable, replicas, false)
	if err != nil {
		return 0
	}
	s, err := intstr.GetScaledValueFromIntOrPercent(&surge, replicas, true)
	if err == nil && u == 0 && s == 0 {
		return 1
	}
	return u
}

// mode is the holder mode the annotations ask for (Pod when unset).
func mode(annotations map[string]string) locksv1alpha1.HolderMode {
	if m := locksv1alpha1.HolderMode(annotations[locksv1alpha1.AnnotationHolderMode]); m != "" {
		return m
	}
	return locksv1alpha1.HolderModePod
}
