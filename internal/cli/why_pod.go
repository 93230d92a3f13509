package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// whyNamedPod explains the Pod ns/name.
func whyNamedPod(ctx context.Context, c client.Client, ns, name string, out io.Writer, now time.Time) error {
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %q not found in namespace %q", name, ns)
		}
		return fmt.Errorf("get pod %q in namespace %q: %w", name, ns, err)
	}
	return whyPod(ctx, c, &pod, out, now)
}

// whyPod writes the explanation for one Pod: which lock gates it and who
// holds it for the Pod, then where the Pod is (waiting at its scheduling
// gate, running with its fencing token, lost its lease, terminating,
// finished), then the lock as its status shows it.
func whyPod(ctx context.Context, c client.Client, pod *corev1.Pod, out io.Writer, now time.Time) error {
	ref := fmt.Sprintf("Pod %s/%s", pod.Namespace, pod.Name)
	a := pod.Annotations
	lockName := a[locksv1alpha1.AnnotationLock]
	if lockName == "" {
		lockName = pod.Labels[locksv1alpha1.LabelLock]
	}
	var lines []string
	say := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }

	if job := controllerOf(pod.OwnerReferences, "batch", "Job"); job != "" {
		// The Job gate holds the lock for the whole Job: its Pods are never gated.
		if lockName == "" {
			say("%s is not gated by lockwarden: it has no %s annotation. It belongs to Job %s; if that Job is gated, lockwarden gates the Job, not its Pods: ask kubectl lockwarden why job/%s.", ref, locksv1alpha1.AnnotationLock, job, job)
		} else {
			say("%s belongs to Job %s, which lockwarden gates as a whole (it never gates a Job's Pods): ask kubectl lockwarden why job/%s.", ref, job, job)
		}
		return writeLines(out, lines)
	}
	if lockName == "" {
		say("%s is not gated by lockwarden: it has no %s annotation (on the Pod, from its pod template).", ref, locksv1alpha1.AnnotationLock)
		return writeLines(out, lines)
	}
	if _, gated := pod.Labels[locksv1alpha1.LabelLock]; !gated {
		say("%s names lock %s but lockwarden has not gated it: it has no %s label, so the admission webhook did not gate it when it was created (was the annotation added later, or was the Pod created before the webhook ran, or in a namespace it skips?). It runs without the lock.",
			ref, lockName, locksv1alpha1.LabelLock)
		return writeLines(out, lines)
	}

	dl, lockErr := getLock(ctx, c, pod.Namespace, lockName)
	kind, workload, byWorkload := podHolder(pod)
	// who is the holder as a sentence's subject: "it" or "its Deployment web".
	who := "it"
	if byWorkload {
		say("%s is gated by lock %s, holder mode %s: its %s %s holds the lock once for all its Pods in this cluster, and they run together with its fencing token.",
			ref, lockName, locksv1alpha1.HolderModeWorkload, kind, workload)
		who = fmt.Sprintf("its %s %s", kind, workload)
	} else {
		mode := fmt.Sprintf("holder mode %s: the Pod holds the lock for itself", locksv1alpha1.HolderModePod)
		if locksv1alpha1.HolderMode(a[locksv1alpha1.AnnotationHolderMode]) == locksv1alpha1.HolderModeWorkload {
			mode = fmt.Sprintf("holder mode %s, but no workload is recorded on it (%s), so the Pod holds the lock for itself", locksv1alpha1.HolderModeWorkload, locksv1alpha1.AnnotationWorkload)
		}
		if k, n, ok := parseWorkloadAnnotation(a[locksv1alpha1.AnnotationWorkload]); ok {
			mode += fmt.Sprintf(" (its workload: %s %s)", k, n)
		}
		say("%s is gated by lock %s, %s.", ref, lockName, mode)
	}

	fence := a[locksv1alpha1.AnnotationFencingToken]
	lost, lostWhy := podLost(pod)
	switch {
	case !pod.DeletionTimestamp.IsZero():
		whyTerminating(say, pod, lockName, fence, who, byWorkload)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		say("It has finished (phase %s) and no longer takes part in lock %s.", pod.Status.Phase, lockName)
		if fence != "" && byWorkload {
			say("It ran with fencing token %s; %s's lease is released when none of its Pods in this cluster keeps it any more.", fence, strings.TrimPrefix(who, "its "))
		} else if fence != "" && slices.Contains(pod.Finalizers, locksv1alpha1.Finalizer) {
			say("It ran with fencing token %s; lockwarden releases that lease, then removes its finalizer %s.", fence, locksv1alpha1.Finalizer)
		} else if fence != "" {
			say("It ran with fencing token %s, and its lease was released.", fence)
		}
	case lost:
		say("It lost its lease on lock %s (%s).", lockName, lostWhy)
		if fence != "" {
			say("It held the lock with fencing token %s; a resource that checks fencing tokens refuses its writes once a newer holder wrote.", fence)
		}
		if dl != nil {
			if dl.Spec.OnLost == locksv1alpha1.OnLostTerminate {
				say("The lock's onLost is Terminate: lockwarden evicts the Pod, and its workload creates a gated Pod in its place.")
			} else {
				say("The lock's onLost is %s: the Pod runs on without the lock.", dl.Spec.OnLost)
			}
		}
	case podHasGate(pod):
		whyWaiting(say, pod, lockName, who, byWorkload, lockErr, now)
		if lockErr != nil {
			return writeLines(out, lines)
		}
	case fence != "":
		holderID := a[locksv1alpha1.AnnotationHolder]
		if byWorkload {
			say("It is not gated any more: %s holds lock %s as %s with fencing token %s (the Pod's %s environment variable).", who, lockName, holderID, fence, locksv1alpha1.EnvFencingToken)
		} else {
			say("It is not gated any more: it holds lock %s as %s with fencing token %s (its %s environment variable).", lockName, holderID, fence, locksv1alpha1.EnvFencingToken)
		}
	default:
		say("Its scheduling gate %s was removed, but it does not hold lock %s (it has no %s annotation): someone other than lockwarden removed the gate, and lockwarden deletes the Pod so that its workload creates a gated one.",
			locksv1alpha1.SchedulingGate, lockName, locksv1alpha1.AnnotationFencingToken)
	}
	if dl != nil {
		whyLock(say, dl, now)
	}
	return writeLines(out, lines)
}

// whyWaiting explains a Pod still held back by lockwarden's scheduling gate.
func whyWaiting(say func(string, ...any), pod *corev1.Pod, lockName, who string, byWorkload bool, lockErr error, now time.Time) {
	a := pod.Annotations
	pending := fmt.Sprintf("It is Pending: its scheduling gate %s keeps it off every node until %s holds lock %s", locksv1alpha1.SchedulingGate, who, lockName)
	if lockErr != nil {
		say("%s, but %v. It starts once the lock exists and %s gets its turn.", pending, lockErr, who)
		return
	}
	pos, length, queued := parsePosition(a[locksv1alpha1.AnnotationQueuePosition])
	switch {
	case queued:
		say("%s; position %d of %d in the queue (1 is next; %s).", pending, pos, length, locksv1alpha1.AnnotationQueuePosition)
	case byWorkload:
		say("%s (or finds that another of its Pods acquired it already); the operator has not placed it in the queue yet (no %s annotation).", pending, locksv1alpha1.AnnotationQueuePosition)
	default:
		say("%s; the operator has not placed it in the queue yet (no %s annotation).", pending, locksv1alpha1.AnnotationQueuePosition)
	}
	if wf := a[locksv1alpha1.AnnotationWaitingFor]; wf != "" {
		say("It waits behind: %s (%s).", wf, locksv1alpha1.AnnotationWaitingFor)
	}
	say("It has waited %s, since the Pod was created.", humanSince(now, pod.CreationTimestamp.Time))
}

// whyTerminating explains a Pod being deleted: when it lets go of its lock.
// The operator releases only once the Pod's containers stopped, unless the
// Pod hands over at the start of termination or was force-deleted; in
// holder mode Workload the workload's lease is released once none of its
// Pods here keeps it.
func whyTerminating(say func(string, ...any), pod *corev1.Pod, lockName, fence, who string, byWorkload bool) {
	a := pod.Annotations
	if podHasGate(pod) || fence == "" {
		say("It is being deleted before it held lock %s: it leaves the queue, and lockwarden then removes its finalizer %s.", lockName, locksv1alpha1.Finalizer)
		return
	}
	// lets is what letting go means for this Pod: releasing its own lease,
	// or no longer keeping its workload's.
	lets := fmt.Sprintf("lockwarden releases the lease it holds with fencing token %s", fence)
	if byWorkload {
		lets = fmt.Sprintf("it stops keeping the lease of %s (fencing token %s)", strings.TrimPrefix(who, "its "), fence)
	}
	switch {
	case a[locksv1alpha1.AnnotationHandover] == locksv1alpha1.HandoverTerminating:
		say("It is terminating and hands the lock over at once (%s: %s): %s now, while its containers may still run for their grace period; the next holder gets a larger fencing token.",
			locksv1alpha1.AnnotationHandover, locksv1alpha1.HandoverTerminating, lets)
	case pod.DeletionGracePeriodSeconds != nil && *pod.DeletionGracePeriodSeconds == 0:
		say("It was force-deleted (grace period 0), which says its containers have stopped: %s at once.", lets)
	case containersStopped(pod):
		say("It is terminating and its containers have stopped: %s, then removes its finalizer %s.", lets, locksv1alpha1.Finalizer)
	default:
		say("It is terminating and still counts as holding lock %s: once the Pod's containers have stopped (not when deletion starts), %s. A forced deletion (--grace-period=0 --force) lets go at once.", lockName, lets)
	}
	if byWorkload {
		say("In holder mode %s the lease is released when no Pod of %s in this cluster keeps it any more.", locksv1alpha1.HolderModeWorkload, strings.TrimPrefix(who, "its "))
	}
}

// whyLock says who holds the lock, and what its status reports about
// blocked rollouts and its backend.
func whyLock(say func(string, ...any), dl *locksv1alpha1.DistributedLock, now time.Time) {
	say("Lock %s (keys %s, maxHolders %d) %s.", dl.Name, lockKeys(dl), max(dl.Spec.MaxHolders, 1), lockIs(dl, now))
	if len(dl.Status.Holders) > 1 {
		holders := make([]string, 0, len(dl.Status.Holders))
		for _, h := range dl.Status.Holders {
			holders = append(holders, fmt.Sprintf("%s (fencing token %d)", h.Identity, h.FencingToken))
		}
		say("Its holders: %s.", strings.Join(holders, ", "))
	}
	if c := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionRolloutBlocked); c != nil && c.Status == metav1.ConditionTrue {
		say("Its rollout is blocked (condition %s): %s", locksv1alpha1.ConditionRolloutBlocked, c.Message)
	}
	if c := backendProblem(dl); c != "" {
		say("%s", c)
	}
}

// podHolder says who holds the lock for a gated Pod: its workload (kind
// and name) in holder mode Workload, as the operator decides it (the mode
// annotation and a workload recorded by the webhook), else the Pod.
func podHolder(pod *corev1.Pod) (kind, name string, byWorkload bool) {
	if locksv1alpha1.HolderMode(pod.Annotations[locksv1alpha1.AnnotationHolderMode]) != locksv1alpha1.HolderModeWorkload {
		return "", "", false
	}
	kind, name, ok := parseWorkloadAnnotation(pod.Annotations[locksv1alpha1.AnnotationWorkload])
	return kind, name, ok
}

// parseWorkloadAnnotation splits the workload annotation, Kind/name/uid.
func parseWorkloadAnnotation(s string) (kind, name string, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return "", "", false
	}
	switch parts[0] {
	case "Deployment", "StatefulSet", "ReplicaSet":
		return parts[0], parts[1], true
	}
	return "", "", false
}

// podLost reports whether the Pod's lease was lost, with what says so: the
// lost annotation, or the LockHeld condition False.
func podLost(pod *corev1.Pod) (bool, string) {
	if v := pod.Annotations[locksv1alpha1.AnnotationLost]; v != "" {
		return true, fmt.Sprintf("%s: %s", locksv1alpha1.AnnotationLost, v)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == locksv1alpha1.PodConditionLockHeld && c.Status == corev1.ConditionFalse {
			return true, fmt.Sprintf("condition %s=False, reason %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	return false, ""
}

// podHasGate tells whether the Pod still carries lockwarden's scheduling gate.
func podHasGate(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == locksv1alpha1.SchedulingGate })
}

// containersStopped tells whether every container of the Pod that ever
// started has terminated, as its status last reported.
func containersStopped(pod *corev1.Pod) bool {
	statuses := append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...)
	if pod.Spec.NodeName == "" {
		return true
	}
	if len(statuses) == 0 {
		return false
	}
	for _, s := range statuses {
		if s.State.Terminated == nil && (s.State.Running != nil || s.State.Waiting == nil) {
			return false
		}
	}
	return true
}

// controllerOf is the name of the controlling owner of the kind in group, or "".
func controllerOf(refs []metav1.OwnerReference, group, kind string) string {
	for _, r := range refs {
		if r.Kind == kind && r.Controller != nil && *r.Controller && schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).Group == group {
			return r.Name
		}
	}
	return ""
}
