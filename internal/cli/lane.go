package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// keyGiven tells whether --key was given; an empty one is refused, before
// connecting, with what it takes.
func keyGiven(cmd *cobra.Command, key string) (bool, error) {
	if !cmd.Flags().Changed("key") {
		return false, nil
	}
	if key == "" {
		return true, fmt.Errorf("--key needs a derived key: kubectl lockwarden %s LOCK --key KEY, for example --key deploy/prod (the lockwarden.io/key annotation of the lock's Jobs and Pods)", cmd.Name())
	}
	return true, nil
}

// laneLock reads the lock a --key names a lane of; a lock with fixed keys
// has no lanes, and --key on it is refused with the keys it has.
func laneLock(ctx context.Context, c client.Client, ns, name, key string) (*locksv1alpha1.DistributedLock, error) {
	dl, err := getLock(ctx, c, ns, name)
	if err != nil {
		return nil, err
	}
	if key != "" && dl.Spec.KeyFrom == nil {
		return nil, fmt.Errorf("--key %q: lock %q has fixed keys (%s); --key selects one derived key of a lock with spec.keyFrom", key, name, lockKeys(dl))
	}
	return dl, nil
}

// laneHolder is one lease on a lane held through the lock in this
// namespace: a Job, a Pod, or a workload for the Pods that keep it.
type laneHolder struct {
	identity string
	fence    string
	// objects are the Jobs and Pods that hold it, as Kind/name.
	objects []string
	// since is when the first of them started (zero when unknown).
	since time.Time
	// started says what since is, for example "the Job started".
	started string
}

// laneWaiter is one Job or Pod of the lane waiting for it.
type laneWaiter struct {
	object     string
	position   int
	length     int
	waitingFor string
	since      time.Time
}

// laneView is one derived key of a lock as this namespace and the lock's
// status show it.
type laneView struct {
	lock    *locksv1alpha1.DistributedLock
	key     string
	holders []laneHolder
	waiters []laneWaiter
	// busiest is the key's entry in status.lanes.busiest, or nil.
	busiest *locksv1alpha1.LaneStatus
}

// readLane finds the Jobs and Pods of the lock in ns whose
// lockwarden.io/key is key, and tells the ones holding the lane (a fencing
// token, no longer suspended or gated) from those waiting for it.
func readLane(ctx context.Context, c client.Client, ns, name, key string) (*laneView, error) {
	dl, err := laneLock(ctx, c, ns, name, key)
	if err != nil {
		return nil, err
	}
	of := client.MatchingLabels{locksv1alpha1.LabelLock: name}
	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(ns), of); err != nil {
		return nil, fmt.Errorf("list the Jobs of lock %q in namespace %q: %w", name, ns, err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), of); err != nil {
		return nil, fmt.Errorf("list the Pods of lock %q in namespace %q: %w", name, ns, err)
	}
	v := &laneView{lock: dl, key: key, busiest: busiestLane(&dl.Status, key)}
	for i := range jobs.Items {
		if job := &jobs.Items[i]; job.Annotations[locksv1alpha1.AnnotationKey] == key {
			v.addJob(job)
		}
	}
	for i := range pods.Items {
		if pod := &pods.Items[i]; pod.Annotations[locksv1alpha1.AnnotationKey] == key {
			v.addPod(pod)
		}
	}
	slices.SortFunc(v.holders, func(a, b laneHolder) int { // by fencing token, oldest first
		if len(a.fence) != len(b.fence) {
			return len(a.fence) - len(b.fence)
		}
		return strings.Compare(a.fence, b.fence)
	})
	slices.SortStableFunc(v.waiters, func(a, b laneWaiter) int {
		switch {
		case a.position > 0 && b.position > 0:
			return a.position - b.position
		case a.position > 0:
			return -1
		case b.position > 0:
			return 1
		}
		return a.since.Compare(b.since)
	})
	return v, nil
}

// addJob records a Job of the lane that holds it or waits for it; one
// that finished, was skipped, lost its lease or runs without the lock
// takes no part.
func (v *laneView) addJob(job *batchv1.Job) {
	a := job.Annotations
	finished, _, _ := finishedCondition(job)
	if finished || a[locksv1alpha1.AnnotationSkipped] != "" || a[locksv1alpha1.AnnotationLost] != "" {
		return
	}
	suspended := job.Spec.Suspend != nil && *job.Spec.Suspend
	fence := a[locksv1alpha1.AnnotationFencingToken]
	switch {
	case !suspended && fence != "":
		v.addHolder(a[locksv1alpha1.AnnotationHolder], fence, "Job/"+job.Name, job.Status.StartTime, "the Job started")
	case suspended && fence == "":
		v.addWaiter("Job/"+job.Name, a, job.CreationTimestamp.Time)
	}
}

// addPod records a Pod of the lane that holds it (for itself or for its
// workload) or waits at its scheduling gate.
func (v *laneView) addPod(pod *corev1.Pod) {
	a := pod.Annotations
	lost, _ := podLost(pod)
	if lost || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	deleting := !pod.DeletionTimestamp.IsZero()
	// A terminating Pod holds on until its containers stop, unless it hands over at once.
	handedOver := deleting && a[locksv1alpha1.AnnotationHandover] == locksv1alpha1.HandoverTerminating
	fence := a[locksv1alpha1.AnnotationFencingToken]
	switch {
	case podHasGate(pod):
		if !deleting {
			v.addWaiter("Pod/"+pod.Name, a, pod.CreationTimestamp.Time)
		}
	case fence != "" && !handedOver:
		v.addHolder(a[locksv1alpha1.AnnotationHolder], fence, "Pod/"+pod.Name, pod.Status.StartTime, "the Pod started")
	}
}

// add records one more Job or Pod keeping the lease.
func (h *laneHolder) add(object string, since time.Time, started string) {
	h.objects = append(h.objects, object)
	if !since.IsZero() && (h.since.IsZero() || since.Before(h.since)) {
		h.since, h.started = since, started
	}
}

// addHolder adds object, started at startTime (nil when unknown), to the
// holder with its identity and token: the Pods of a workload in holder mode
// Workload share one lease.
func (v *laneView) addHolder(identity, fence, object string, startTime *metav1.Time, started string) {
	var since time.Time
	if startTime != nil {
		since = startTime.Time
	}
	for i := range v.holders {
		if h := &v.holders[i]; h.identity == identity && h.fence == fence {
			h.add(object, since, started)
			return
		}
	}
	h := laneHolder{identity: identity, fence: fence}
	h.add(object, since, started)
	v.holders = append(v.holders, h)
}

// addWaiter adds a Job or Pod waiting for the lane, with its place in line
// when the operator has set it.
func (v *laneView) addWaiter(object string, a map[string]string, created time.Time) {
	w := laneWaiter{object: object, waitingFor: a[locksv1alpha1.AnnotationWaitingFor], since: created}
	if pos, length, ok := parsePosition(a[locksv1alpha1.AnnotationQueuePosition]); ok {
		w.position, w.length = pos, length
	}
	v.waiters = append(v.waiters, w)
}

// idle tells whether nothing is known to hold or wait for the lane: no
// Job or Pod of this namespace, and not among the busiest keys.
func (v *laneView) idle() bool {
	return len(v.holders) == 0 && len(v.waiters) == 0 && (v.busiest == nil || v.busiest.Holders+v.busiest.Waiting == 0)
}

// nothingHere is the sentence for a lane nothing holds or waits for.
func (v *laneView) nothingHere() string {
	return fmt.Sprintf("Nothing holds or waits for key %s: no Job or Pod of lock %s in namespace %s has %s %s, and it is not among the busiest keys of status.lanes.",
		v.key, v.lock.Name, v.lock.Namespace, locksv1alpha1.AnnotationKey, v.key)
}

// heldElsewhere says who the holders that status.lanes counts for the key
// may be when no Job or Pod of this namespace holds it.
func (v *laneView) heldElsewhere() string {
	s := "in another cluster or through another lock that derives the same key"
	if c := v.lock.Spec.CooldownSeconds; c > 0 {
		s += fmt.Sprintf(", or a lease cooling down for spec.cooldownSeconds (%ds) after its holder released it", c)
	}
	return s
}

// busiestLane is the key's entry in status.lanes.busiest, or nil.
func busiestLane(st *locksv1alpha1.DistributedLockStatus, key string) *locksv1alpha1.LaneStatus {
	if st.Lanes == nil {
		return nil
	}
	for i := range st.Lanes.Busiest {
		if st.Lanes.Busiest[i].Key == key {
			return &st.Lanes.Busiest[i]
		}
	}
	return nil
}

// laneCounts is a busiest lane's counts, as queue and status show them.
func laneCounts(l *locksv1alpha1.LaneStatus) string {
	return fmt.Sprintf("%d holding (newest fencing token %d), %d waiting", l.Holders, l.FencingToken, l.Waiting)
}

// place is a waiter's place in line as a sentence shows it, "" when the
// operator has not set it.
func (w laneWaiter) place() string {
	if w.position == 0 {
		return ""
	}
	return fmt.Sprintf(" (position %d of %d)", w.position, w.length)
}
