package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/webhook"
)

// rolloutBlockedFor is how long a blocked rollout found by a waiting Pod
// stays on its lock's status without being found again (the waiting Pod
// finds it again at every attempt, every podWaitRequeue).
const rolloutBlockedFor = 15 * time.Second

// rolloutMemory remembers, per lock, the Deployment rollout last found
// waiting for the lock its own old Pods hold (see checkRollout), for the
// lock's RolloutBlocked condition. A nil *rolloutMemory remembers nothing.
type rolloutMemory struct {
	mu      sync.Mutex
	blocked map[types.NamespacedName]blockedRollout
}

type blockedRollout struct {
	deployment, message string
	at                  time.Time
}

func newRolloutMemory() *rolloutMemory {
	return &rolloutMemory{blocked: map[types.NamespacedName]blockedRollout{}}
}

// set records the blocked rollout of lock and reports whether it is new
// (not recorded, or recorded for another Deployment, or expired).
func (m *rolloutMemory) set(lock types.NamespacedName, b blockedRollout) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, ok := m.blocked[lock]
	m.blocked[lock] = b
	return !ok || prev.deployment != b.deployment || b.at.Sub(prev.at) > rolloutBlockedFor
}

// clear forgets the blocked rollout of lock (a Pod of it acquired: the
// rollout moves) and reports whether there was one.
func (m *rolloutMemory) clear(lock types.NamespacedName) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.blocked[lock]
	delete(m.blocked, lock)
	return ok
}

// of returns the message of the blocked rollout of lock still current at now.
func (m *rolloutMemory) of(lock types.NamespacedName, now time.Time) string {
	if m == nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blocked[lock]
	if !ok {
		return ""
	}
	if now.Sub(b.at) > rolloutBlockedFor {
		delete(m.blocked, lock)
		return ""
	}
	return b.message
}

// checkRollout finds a Deployment whose rolling update cannot go on: the
// waiting Pod belongs to its new ReplicaSet, the lock is held by a Pod of
// the same Deployment's older ReplicaSet, and the strategy keeps the old
// Pods until new ones are available (maxUnavailable too small for the
// lock's maxHolders). It records it for the lock's status and says so in
// Events on the lock and the Deployment.
func (r *PodReconciler) checkRollout(ctx context.Context, g *gatedPod, busy *lock.HeldError) {
	pod := g.pod
	kind, name, uid, ok := parseWorkload(pod.Annotations[locksv1alpha1.AnnotationWorkload])
	if g.mode != locksv1alpha1.HolderModePod || !ok || kind != "Deployment" || busy.Holder == "" || r.apiReader == nil {
		return
	}
	h := holder.Decode(busy.Holder)
	if h.Kind != podKind || h.Cluster != r.ClusterName || h.Namespace != pod.Namespace {
		return
	}
	var holding corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: h.Name}, &holding); err != nil {
		return
	}
	hash := appsv1.DefaultDeploymentUniqueLabelKey
	if holding.Annotations[locksv1alpha1.AnnotationWorkload] != pod.Annotations[locksv1alpha1.AnnotationWorkload] || holding.Labels[hash] == pod.Labels[hash] {
		return
	}
	var d appsv1.Deployment
	if err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, &d); err != nil || string(d.UID) != uid {
		return
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return
	}
	replicas := int(ptr.Deref(d.Spec.Replicas, 1))
	unavailable := webhook.RolloutMaxUnavailable(&d)
	need := replicas - max(int(g.dl.Spec.MaxHolders), 1) + 1
	if unavailable >= need {
		return
	}
	msg := fmt.Sprintf("The rolling update of Deployment %s waits for this lock, which its old Pod %s holds (fencing token %d): with maxUnavailable %d the old Pods stay until a new one is available, "+
		"and a new one is not available before it holds the lock. Set spec.strategy.rollingUpdate.maxUnavailable to at least %d, use strategy Recreate, or delete Pod %s",
		d.Name, h.Name, busy.Fence, unavailable, max(need, 1), h.Name)
	lockNN := types.NamespacedName{Namespace: pod.Namespace, Name: g.dl.Name}
	if r.rollouts.set(lockNN, blockedRollout{deployment: d.Name, message: msg, at: r.Clock.Now()}) {
		logf.FromContext(ctx).Info("Rollout blocked by its own lock", "deployment", d.Name, "lock", g.dl.Name)
		r.Recorder.Eventf(g.dl, &d, corev1.EventTypeWarning, locksv1alpha1.EventRolloutBlocked, "Wait", "%s", msg)
		r.Recorder.Eventf(&d, g.dl, corev1.EventTypeWarning, locksv1alpha1.EventRolloutBlocked, "Wait", "%s", msg)
		if r.lockChanged != nil {
			r.lockChanged(lockNN)
		}
	}
}
