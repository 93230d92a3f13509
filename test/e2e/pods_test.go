//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// annotationRollout is the pod-template annotation a test changes to roll a Deployment out.
const annotationRollout = "e2e.lockwarden.io/rollout"

// podTTL is the TTL of the Pod scenarios' locks where nothing waits on an
// expiry: short, so that a lease that is never released (a bug) still shows
// as a handover of about this long instead of hanging the test.
const podTTL = 10

// newPodLock returns a lock on the cluster's ClusterLockBackend dev-redis
// for gated Pods: explicit keys, maxHolders, a short TTL.
func newPodLock(ns, name, key string, maxHolders int32, ttl int32) *locksv1alpha1.DistributedLock {
	dl := newBackendLock(ns, name, key, "")
	dl.Spec.MaxHolders = maxHolders
	dl.Spec.TTLSeconds = ttl
	return dl
}

// newLockedDeployment returns a Deployment of replicas whose Pods (busybox,
// "run" by kwok until deleted) name lock on their template. Its Pods stop
// within a second of being deleted.
func newLockedDeployment(ns, name, lock string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: "work", Image: "busybox:1.37",
						Command: []string{"sh", "-c", "echo $LOCKWARDEN_FENCING_TOKEN; sleep 3600"},
					}},
				},
			},
		},
	}
}

// rollingUpdate sets a RollingUpdate strategy with these bounds.
func rollingUpdate(d *appsv1.Deployment, maxSurge, maxUnavailable int) {
	d.Spec.Strategy = appsv1.DeploymentStrategy{
		Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxSurge:       ptr.To(intstr.FromInt32(int32(maxSurge))),
			MaxUnavailable: ptr.To(intstr.FromInt32(int32(maxUnavailable))),
		},
	}
}

// warnings collects the warnings the API server returns (from admission
// webhooks among others), as kubectl prints them.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

// take returns the warnings collected since the last call.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// warningClient returns a clientset, as the admin user, whose responses'
// warnings w collects.
func warningClient(t *testing.T, cfg *rest.Config) (*kubernetes.Clientset, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = w
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, w
}

// podsOf returns the Pods of a namespace.
func podsOf(ctx context.Context, c client.Client, ns string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := c.List(ctx, &pods, client.InNamespace(ns))
	return pods.Items, err
}

// dumpOnFailure logs the namespace's Deployments, ReplicaSets, Pods (with
// their gates and lockwarden annotations) and locks when the test failed.
func dumpOnFailure(t *testing.T, c client.Client, ns string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		pods, err := podsOf(ctx, c, ns)
		if err != nil {
			t.Logf("list pods: %v", err)
		}
		for _, p := range pods {
			var gates []string
			for _, g := range p.Spec.SchedulingGates {
				gates = append(gates, g.Name)
			}
			ann := map[string]string{}
			for k, v := range p.Annotations {
				if strings.HasPrefix(k, "lockwarden.io/") {
					ann[k] = v
				}
			}
			t.Logf("pod %s: phase %s, deleting %v, gates %v, finalizers %v, annotations %v, conditions %v",
				p.Name, p.Status.Phase, p.DeletionTimestamp != nil, gates, p.Finalizers, ann, p.Status.Conditions)
		}
		var locks locksv1alpha1.DistributedLockList
		if err := c.List(ctx, &locks, client.InNamespace(ns)); err == nil {
			for _, dl := range locks.Items {
				t.Logf("lock %s: holders %+v, waiting %+v, conditions %+v", dl.Name, dl.Status.Holders, dl.Status.Waiting, dl.Status.Conditions)
			}
		}
		var deps appsv1.DeploymentList
		if err := c.List(ctx, &deps, client.InNamespace(ns)); err == nil {
			for _, d := range deps.Items {
				t.Logf("deployment %s: generation %d, status %+v", d.Name, d.Generation, d.Status)
			}
		}
	})
}

// TestPodMutexDeployment runs a Deployment of 3 replicas on a lock with
// maxHolders 1 in per-Pod mode: at every sample at most one Pod holds
// (ungated and not finished, terminating included) and once settled exactly
// one runs while two wait Pending behind the scheduling gate. Deleting the
// running Pod hands the lock to a waiting one, with a larger fencing token;
// the handover time (delete -> next Pod's gate removed) is measured over
// several handovers.
func TestPodMutexDeployment(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-pod-mutex")
	dumpOnFailure(t, cluster.Client, ns)
	if err := cluster.Client.Create(ctx, newPodLock(ns, "singleton", "pods/singleton", 1, podTTL)); err != nil {
		t.Fatal(err)
	}
	sampler := samplePods(t, atMostHolders(1, false), podSource{cluster: devcluster.ClusterName, client: cluster.Client, config: cluster.Config, namespace: ns, lock: "singleton"})
	cs, warned := warningClient(t, cluster.Config)
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, newLockedDeployment(ns, "singleton", "singleton", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// 3 replicas of which 1 may hold: a rollout could not proceed, and the
	// API server says so (this test deletes Pods, it does not roll out).
	if w := warned.take(); !mentions(w, "maxUnavailable") {
		t.Errorf("no warning about the rollout on create; warnings %q", w)
	}

	const handovers = 6
	var (
		// handover: delete -> next gate removed; release: the deleted
		// Pod's containers stopped (at the end of its grace period, as
		// kwok shows it) -> next gate removed, the operator's own part.
		handover, release []time.Duration
		prev              podView
	)
	for i := 0; ; i++ {
		cur := waitSettled(t, ns, 3)
		if i > 0 {
			if cur.token <= prev.token {
				t.Errorf("handover %d: %s holds with fencing token %d, not above %s's %d", i, cur.name, cur.token, prev.name, prev.token)
			}
		}
		checkHolderPod(t, ns, "singleton", cur.name, cur.token, "Pod")
		if i == handovers {
			break
		}
		prev = cur
		deleted := time.Now()
		if err := cluster.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cur.name}}); err != nil {
			t.Fatal(err)
		}
		var next podView
		waitFor(t, 2*podTTL*time.Second, "another Pod to hold after "+cur.name+" was deleted", func(context.Context) (bool, error) {
			for _, p := range sampler.last().pods {
				if p.uid != cur.uid && p.holds(true) {
					next = p
					return true, nil
				}
			}
			return false, nil
		})
		at, _ := sampler.heldSince(next.uid)
		handover = append(handover, at.Sub(deleted))
		stoppedAfter := "not seen stopped"
		if stopped, ok := sampler.finishedSince(cur.uid); ok {
			release = append(release, at.Sub(stopped))
			stoppedAfter = "stopped after " + stopped.Sub(deleted).Round(time.Millisecond).String()
		}
		t.Logf("handover %d: %s (token %d) deleted, %s; %s (token %d) ungated after %v",
			i+1, cur.name, cur.token, stoppedAfter, next.name, next.token, at.Sub(deleted).Round(time.Millisecond))
	}
	logDurations(t, "Pod handover (Pod deleted -> next Pod's gate removed)", handover)
	logDurations(t, "Pod release (deleted Pod stopped -> next Pod's gate removed)", release)
	if len(handover) > 0 {
		fmt.Printf("BENCHMARK-ROW | Pod handover, per-Pod mode (Deployment of 3, maxHolders 1, grace period 1 s, kwok; timed from watch events) | delete -> next gate removed: p50 %v (min %v, max %v) | old Pod stopped -> next gate removed: p50 %v | %d handovers |\n",
			percentile(handover, 50).Round(10*time.Millisecond), slices.Min(handover).Round(10*time.Millisecond), slices.Max(handover).Round(10*time.Millisecond),
			percentile(release, 50).Round(time.Millisecond), len(handover))
	}
}

// logDurations logs the p50, min and max of ds.
func logDurations(t *testing.T, what string, ds []time.Duration) {
	t.Helper()
	if len(ds) == 0 {
		t.Errorf("%s: nothing measured", what)
		return
	}
	t.Logf("%s, timed from watch events: p50 %v, min %v, max %v over %d", what,
		percentile(ds, 50).Round(time.Millisecond), slices.Min(ds).Round(time.Millisecond), slices.Max(ds).Round(time.Millisecond), len(ds))
}

// waitSettled waits until the namespace's Deployment has replicas Pods, of
// which exactly one holds and runs while the others wait Pending behind the
// gate, annotated with their place in the queue; it returns the holder.
func waitSettled(t *testing.T, ns string, replicas int) podView {
	t.Helper()
	var holder podView
	var last string
	waitFor(t, 60*time.Second, fmt.Sprintf("one of %d Pods to run and the others to wait gated", replicas), func(ctx context.Context) (bool, error) {
		pods, err := podsOf(ctx, cluster.Client, ns)
		if err != nil {
			return false, err
		}
		var running, waiting int
		var states []string
		for i := range pods {
			p := viewPod(devcluster.ClusterName, &pods[i], time.Now())
			states = append(states, p.String())
			switch {
			case p.terminating:
				return false, nil
			case !p.gated && p.phase == corev1.PodRunning && p.token > 0:
				running++
				holder = p
			case p.gated && p.phase == corev1.PodPending && pods[i].Annotations[locksv1alpha1.AnnotationQueuePosition] != "":
				waiting++
			}
		}
		last = strings.Join(states, "; ")
		return len(pods) == replicas && running == 1 && waiting == replicas-1, nil
	})
	t.Logf("settled: %s", last)
	return holder
}

// checkHolderPod checks what a user sees of the holding Pod: its token in
// the container's environment (from the annotation, through the downward
// API), and the lock's status naming it as its holder of kind kind.
func checkHolderPod(t *testing.T, ns, lock, name string, token int64, kind string) {
	t.Helper()
	var pod corev1.Pod
	if err := cluster.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		t.Fatal(err)
	}
	if !envFromAnnotation(&pod) {
		t.Errorf("pod %s: a container lacks %s from the Pod's annotation %s: %+v", name, locksv1alpha1.EnvFencingToken, locksv1alpha1.AnnotationFencingToken, pod.Spec.Containers)
	}
	if pod.Labels[locksv1alpha1.LabelLock] != lock || !slices.Contains(pod.Finalizers, locksv1alpha1.Finalizer) {
		t.Errorf("pod %s: label %s=%q, finalizers %v; want the lock's label and %s", name, locksv1alpha1.LabelLock, pod.Labels[locksv1alpha1.LabelLock], pod.Finalizers, locksv1alpha1.Finalizer)
	}
	waitFor(t, 15*time.Second, "the lock's status to show "+name+" as its holder", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, lock)
		if err != nil {
			return false, err
		}
		return len(dl.Status.Holders) == 1 && dl.Status.Holders[0].Kind == kind && dl.Status.Holders[0].FencingToken == token &&
			(kind != "Pod" || dl.Status.Holders[0].Name == name), nil
	})
}

// percentile returns the p-th percentile (nearest rank) of ds, 0 for none.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// TestPodSamplerSeesTwoHolders is the in-cluster negative control of the
// sampler: on a lock with maxHolders 2, a check for at most one holder must
// fail on the samples it takes, and the sampler must see two Pods hold.
func TestPodSamplerSeesTwoHolders(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-pod-semaphore")
	dumpOnFailure(t, cluster.Client, ns)
	if err := cluster.Client.Create(ctx, newPodLock(ns, "pair", "pods/pair", 2, podTTL)); err != nil {
		t.Fatal(err)
	}
	var caught []string
	var mu sync.Mutex
	check := atMostHolders(1, false)
	sampler := samplePods(t, func(sm sample) []string {
		mu.Lock()
		defer mu.Unlock()
		caught = append(caught, check(sm)...)
		return atMostHolders(2, false)(sm)
	}, podSource{cluster: devcluster.ClusterName, client: cluster.Client, namespace: ns, lock: "pair"})
	if err := cluster.Client.Create(ctx, newLockedDeployment(ns, "pair", "pair", 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "two Pods to hold and the sampler to report it", func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return holderCount(sampler.last().pods, false) == 2 && len(caught) > 0, nil
	})
	mu.Lock()
	t.Logf("the check for one holder caught %d violations, first: %s", len(caught), caught[0])
	mu.Unlock()
}

// TestPodRollout rolls a 1-holder Deployment (per-Pod mode) out, by changing
// a pod-template annotation. With RollingUpdate maxUnavailable 0 the new Pod
// waits for the lock the old one never gives up: the API server returns the
// operator's admission warning when the Deployment is created, and the lock
// shows RolloutBlocked=True until the strategy is patched to maxUnavailable
// 1, after which the rollout completes. With each documented way out
// (Recreate, maxUnavailable 1, and maxUnavailable 1 with the handover
// Terminating) the rollout completes without a warning. At no sample do two
// Pods hold (with the handover Terminating, a terminating Pod has released).
func TestPodRollout(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*appsv1.Deployment)
		// terminatingReleases: a terminating old Pod no longer counts as a holder.
		terminatingReleases bool
		blocked             bool
	}{
		"maxUnavailable 0 is blocked until patched": {edit: func(d *appsv1.Deployment) { rollingUpdate(d, 1, 0) }, blocked: true},
		"Recreate": {edit: func(d *appsv1.Deployment) {
			d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
		}},
		"maxUnavailable 1": {edit: func(d *appsv1.Deployment) { rollingUpdate(d, 1, 1) }},
		// The handover does not end a rollout stopped by maxUnavailable 0
		// (nothing terminates the old Pod); with maxUnavailable 1 it lets
		// the new Pod run during the old one's grace period.
		"handover Terminating": {
			edit: func(d *appsv1.Deployment) {
				rollingUpdate(d, 1, 1)
				d.Annotations = map[string]string{locksv1alpha1.AnnotationHandover: locksv1alpha1.HandoverTerminating}
				// A grace period long enough for samples to see the new Pod
				// hold while the old one may still run.
				d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3)
			},
			terminatingReleases: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			rollout(t, strings.ReplaceAll(strings.ToLower(name), " ", "-"), tc.edit, tc.terminatingReleases, tc.blocked)
		})
	}
}

func rollout(t *testing.T, suffix string, edit func(*appsv1.Deployment), terminatingReleases, blocked bool) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-pod-rollout-"+suffix)
	dumpOnFailure(t, cluster.Client, ns)
	if err := cluster.Client.Create(ctx, newPodLock(ns, "app", "pods/app", 1, podTTL)); err != nil {
		t.Fatal(err)
	}
	sampler := samplePods(t, atMostHolders(1, terminatingReleases), podSource{cluster: devcluster.ClusterName, client: cluster.Client, namespace: ns, lock: "app"})
	cs, warned := warningClient(t, cluster.Config)
	d := newLockedDeployment(ns, "app", "app", 1)
	d.Spec.Template.Annotations[annotationRollout] = "1"
	edit(d)
	created, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := warned.take()
	t.Logf("warnings on create: %q", w)
	if got := mentions(w, "maxUnavailable"); got != blocked {
		t.Errorf("create: a warning about maxUnavailable: %v, want %v (warnings %q)", got, blocked, w)
	}
	waitRolledOut(t, ns, "app", created.Generation, "1")

	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{%q:"2"}}}}}`, annotationRollout)
	updated, err := cs.AppsV1().Deployments(ns).Patch(ctx, "app", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w := warned.take(); mentions(w, "maxUnavailable") != blocked {
		t.Errorf("update: a warning about maxUnavailable: %v, want %v (warnings %q)", !blocked, blocked, w)
	}
	if blocked {
		var cond *metav1.Condition
		waitFor(t, 30*time.Second, "the lock to show RolloutBlocked=True", func(ctx context.Context) (bool, error) {
			dl, err := getLock(ctx, ns, "app")
			if err != nil {
				return false, err
			}
			cond = meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionRolloutBlocked)
			return cond != nil && cond.Status == metav1.ConditionTrue, nil
		})
		t.Logf("RolloutBlocked: %s %s: %s", cond.Status, cond.Reason, cond.Message)
		fix := `{"spec":{"strategy":{"rollingUpdate":{"maxUnavailable":1}}}}`
		if updated, err = cs.AppsV1().Deployments(ns).Patch(ctx, "app", types.StrategicMergePatchType, []byte(fix), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if w := warned.take(); mentions(w, "maxUnavailable") {
			t.Errorf("the fixed Deployment still draws a warning: %q", w)
		}
	}
	waitRolledOut(t, ns, "app", updated.Generation, "2")
	if terminatingReleases {
		// The handover took effect: the new Pod held while the old one was
		// in its grace period (the trade-off the annotation documents).
		n, of := sampler.count("", func(sm sample) bool { return holderCount(sm.pods, false) > 1 })
		t.Logf("samples with the new Pod holding during the old one's grace period: %d of %d", n, of)
		if n == 0 {
			t.Errorf("no sample saw the new Pod hold while the old one was terminating: the handover %s did not take effect", locksv1alpha1.HandoverTerminating)
		}
	}
	if blocked {
		waitFor(t, 30*time.Second, "RolloutBlocked to end", func(ctx context.Context) (bool, error) {
			dl, err := getLock(ctx, ns, "app")
			return err == nil && conditionStatus(dl, locksv1alpha1.ConditionRolloutBlocked) != metav1.ConditionTrue, err
		})
	}
}

// mentions reports whether one of the warnings mentions word.
func mentions(warnings []string, word string) bool {
	return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, word) })
}

// waitRolledOut waits until the Deployment's rollout of generation is
// complete, as `kubectl rollout status` sees it, and its only Pod is one of
// the new template (annotation annotationRollout = rev), running and holding:
// every old Pod is gone.
func waitRolledOut(t *testing.T, ns, name string, generation int64, rev string) {
	t.Helper()
	var state string
	waitFor(t, 60*time.Second, fmt.Sprintf("Deployment %s to roll out revision %s", name, rev), func(ctx context.Context) (bool, error) {
		var d appsv1.Deployment
		if err := cluster.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d); err != nil {
			return false, err
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		st := d.Status
		state = fmt.Sprintf("observed %d/%d, replicas %d, updated %d, available %d", st.ObservedGeneration, generation, st.Replicas, st.UpdatedReplicas, st.AvailableReplicas)
		if st.ObservedGeneration < generation || st.UpdatedReplicas != want || st.Replicas != want || st.AvailableReplicas != want {
			return false, nil
		}
		pods, err := podsOf(ctx, cluster.Client, ns)
		if err != nil {
			return false, err
		}
		for i := range pods {
			p := viewPod(devcluster.ClusterName, &pods[i], time.Now())
			if pods[i].Annotations[annotationRollout] != rev || p.terminating || p.gated || p.phase != corev1.PodRunning {
				state += "; pod " + p.String() + " rev " + pods[i].Annotations[annotationRollout]
				return false, nil
			}
		}
		return len(pods) == int(want), nil
	})
	t.Logf("rolled out revision %s: %s", rev, state)
}
