package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// gatedPodOf is a Pod that names lock, with the given extra annotations and owners.
func gatedPodOf(name, namespace, lock string, annotations map[string]string, owners ...metav1.OwnerReference) *corev1.Pod {
	a := map[string]string{locksv1alpha1.AnnotationLock: lock}
	for k, v := range annotations {
		a[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: a, OwnerReferences: owners},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
}

// podRunsWithLock tells whether a Pod may run under its lock: its gate is
// gone and it carries its fencing token, and it is not being deleted.
func podRunsWithLock(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && !podGated(p) && p.Annotations[locksv1alpha1.AnnotationFencingToken] != "" && p.Annotations[locksv1alpha1.AnnotationLost] == ""
}

// ungatedPods returns the names of the Pods in namespace that run with their lock.
func ungatedPods(t *testing.T, c client.Client, namespace string) []string {
	t.Helper()
	var pods corev1.PodList
	if err := c.List(context.Background(), &pods, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range pods.Items {
		if podRunsWithLock(&pods.Items[i]) {
			out = append(out, pods.Items[i].Name)
		}
	}
	slices.Sort(out)
	return out
}

// podOverlap watches the Pods of namespaces (in their clusters) and records
// every moment more than limit of them ran with their lock at once.
type podOverlap struct {
	mu       sync.Mutex
	running  map[string]bool
	overlaps []string
	limit    int
}

func watchPodOverlap(t *testing.T, limit int, watches map[string]client.WithWatch, namespace string) *podOverlap {
	t.Helper()
	o := &podOverlap{running: map[string]bool{}, limit: limit}
	for cluster, c := range watches {
		w, err := c.Watch(context.Background(), &corev1.PodList{}, client.InNamespace(namespace))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					o.see(cluster+"/"+p.Name, ev.Type != watch.Deleted && podRunsWithLock(p))
				}
			}
		}()
	}
	return o
}

// see records that name runs (or not) and any overlap that makes.
func (o *podOverlap) see(name string, runs bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.running[name] = runs
	var names []string
	for n, r := range o.running {
		if r {
			names = append(names, n)
		}
	}
	if len(names) > o.limit {
		slices.Sort(names)
		o.overlaps = append(o.overlaps, strings.Join(names, "+"))
	}
}

func (o *podOverlap) check(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.overlaps) > 0 {
		t.Fatalf("more than %d Pods ran with the lock at once: %v", o.limit, o.overlaps)
	}
}

// TestPodOverlapCatchesTwoRunningPods is the overlap watch's negative
// control: two Pods running at once are seen.
func TestPodOverlapCatchesTwoRunningPods(t *testing.T) {
	t.Parallel()
	o := &podOverlap{running: map[string]bool{}, limit: 1}
	o.see("east/a", true)
	o.see("west/b", true)
	o.see("east/a", false)
	if len(o.overlaps) != 1 || o.overlaps[0] != "east/a+west/b" {
		t.Fatalf("overlaps %v, want the one moment east/a and west/b ran together", o.overlaps)
	}
}

func podFence(t *testing.T, p *corev1.Pod) int64 {
	t.Helper()
	f, err := strconv.ParseInt(p.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	if err != nil {
		t.Fatalf("Pod %s: fencing token %q: %v", p.Name, p.Annotations[locksv1alpha1.AnnotationFencingToken], err)
	}
	return f
}

func getPod(t *testing.T, c client.Client, namespace, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := c.Get(context.Background(), nn(namespace, name), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// waitPodGone waits until the Pod is deleted for good (its finalizer removed).
func waitPodGone(t *testing.T, c client.Client, namespace, name string) {
	t.Helper()
	eventually(t, 10*time.Second, "Pod "+name+" to be gone", func() (bool, string) {
		err := c.Get(context.Background(), nn(namespace, name), &corev1.Pod{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func TestPodsOfAOneHolderLockRunOneAtATime(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	ov := watchPodOverlap(t, 1, map[string]client.WithWatch{"test": watchClient(t, env)}, ns)
	names := []string{"web-a", "web-b", "web-c"}
	for _, n := range names {
		create(t, gatedPodOf(n, ns, "billing", nil))
	}
	// The webhook gated each one.
	for _, n := range names {
		p := getPod(t, c, ns, n)
		if p.Labels[locksv1alpha1.LabelLock] != "billing" || !slices.Contains(p.Finalizers, locksv1alpha1.Finalizer) {
			t.Fatalf("Pod %s was not gated: labels %v, finalizers %v", n, p.Labels, p.Finalizers)
		}
	}
	var prev int64
	for round := range names {
		var holder string
		eventually(t, 10*time.Second, "one Pod to run with the lock", func() (bool, string) {
			running := ungatedPods(t, c, ns)
			if len(running) == 1 {
				holder = running[0]
			}
			return len(running) == 1, fmt.Sprint(running)
		})
		p := getPod(t, c, ns, holder)
		if f := podFence(t, p); f <= prev {
			t.Fatalf("Pod %s has fencing token %d, not larger than the previous holder's %d", holder, f, prev)
		} else {
			prev = f
		}
		if p.Annotations[locksv1alpha1.AnnotationHolder] == "" {
			t.Errorf("Pod %s carries no holder annotation", holder)
		}
		// The others wait behind it, gated, and say so.
		if round < len(names)-1 {
			eventually(t, 10*time.Second, "the waiting Pods to show their place", func() (bool, string) {
				var pods corev1.PodList
				if err := c.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
					return false, err.Error()
				}
				for i := range pods.Items {
					q := &pods.Items[i]
					if q.Name != holder && (!podGated(q) || q.Annotations[locksv1alpha1.AnnotationWaitingFor] == "") {
						return false, fmt.Sprintf("%s gates %v annotations %v", q.Name, q.Spec.SchedulingGates, q.Annotations)
					}
				}
				return true, ""
			})
			// 30 s: on a loaded machine (make test runs the packages side by
			// side) a waiter's first attempt can time out writing to Redis
			// and join the queue at its retry.
			eventually(t, 30*time.Second, "the lock's status to name the holding Pod", func() (bool, string) {
				dl := getLock(t, ns, "billing")
				return dl.Status.Holder != nil && dl.Status.Holder.Kind == "Pod" && dl.Status.Holder.Name == holder && len(dl.Status.Waiting) == len(names)-1-round,
					fmt.Sprintf("holder %+v, waiting %+v", dl.Status.Holder, dl.Status.Waiting)
			})
		}
		if err := c.Delete(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		waitPodGone(t, c, ns, holder)
	}
	ov.check(t)
}

func TestWorkloadHoldsOnceForAllItsPodsAndTheOtherWaits(t *testing.T) {
	rdb := redistest.Start(t)
	envB := kubetest.Start(t, kubetest.WithWebhooks())
	startManager(t, managerOptions{cluster: "east"})
	startManager(t, managerOptions{cluster: "west", env: envB})
	// The same namespace name in both clusters: scope Namespace keys are equal.
	ns := newNamespace(t, nil)
	namedNamespace(t, envB, ns)
	for _, e := range []*kubetest.Env{env, envB} {
		if err := e.Client.Create(context.Background(), makeLock("consumer", ns, rdb.Addr).obj()); err != nil {
			t.Fatal(err)
		}
	}
	ov := watchPodOverlap(t, 2, map[string]client.WithWatch{"east": watchClient(t, env), "west": watchClient(t, envB)}, ns)
	// The same Deployment in both clusters: a Deployment and its
	// ReplicaSet, and two Pods of it, Workload mode.
	deploy := func(e *kubetest.Env) []metav1.OwnerReference {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: ns}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}}}
		if err := e.Client.Create(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "consumer-1", Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
			Spec: appsv1.ReplicaSetSpec{Selector: d.Spec.Selector, Template: d.Spec.Template}}
		if err := e.Client.Create(context.Background(), rs); err != nil {
			t.Fatal(err)
		}
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}
	}
	workload := map[string]string{locksv1alpha1.AnnotationHolderMode: "Workload"}
	eastOwner := deploy(env)
	for _, n := range []string{"consumer-1-a", "consumer-1-b"} {
		create(t, gatedPodOf(n, ns, "consumer", workload, eastOwner...))
	}
	eventually(t, 10*time.Second, "both east Pods to run with the workload's lease", func() (bool, string) {
		r := ungatedPods(t, env.Client, ns)
		return len(r) == 2, fmt.Sprint(r)
	})
	a, b := getPod(t, env.Client, ns, "consumer-1-a"), getPod(t, env.Client, ns, "consumer-1-b")
	if podFence(t, a) != podFence(t, b) || a.Annotations[locksv1alpha1.AnnotationWorkload] == "" ||
		!strings.HasPrefix(a.Annotations[locksv1alpha1.AnnotationHolder], "east/"+ns+"/Deployment/consumer/") {
		t.Fatalf("east Pods hold tokens %d and %d as %q (workload %q), want one token held by the Deployment",
			podFence(t, a), podFence(t, b), a.Annotations[locksv1alpha1.AnnotationHolder], a.Annotations[locksv1alpha1.AnnotationWorkload])
	}
	westOwner := deploy(envB)
	for _, n := range []string{"consumer-1-a", "consumer-1-b"} {
		if err := envB.Client.Create(context.Background(), gatedPodOf(n, ns, "consumer", workload, westOwner...)); err != nil {
			t.Fatal(err)
		}
	}
	// The standby cluster's Pods wait, naming the active Deployment.
	eventually(t, 10*time.Second, "the west Pods to wait for the east Deployment", func() (bool, string) {
		p := getPod(t, envB.Client, ns, "consumer-1-a")
		return podGated(p) && strings.Contains(p.Annotations[locksv1alpha1.AnnotationWaitingFor], "east/"+ns+"/Deployment/consumer"), fmt.Sprint(p.Annotations)
	})
	// One of the east Pods ends: the workload still holds.
	if err := env.Client.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, env.Client, ns, a.Name)
	if p := getPod(t, envB.Client, ns, "consumer-1-a"); !podGated(p) {
		t.Fatal("a west Pod started while an east Pod of the holding Deployment still runs")
	}
	// The last one ends: the west Deployment takes over with a larger token.
	if err := env.Client.Delete(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "both west Pods to run", func() (bool, string) {
		r := ungatedPods(t, envB.Client, ns)
		return len(r) == 2, fmt.Sprint(r)
	})
	if w := getPod(t, envB.Client, ns, "consumer-1-a"); podFence(t, w) <= podFence(t, b) {
		t.Fatalf("west token %d not larger than east %d", podFence(t, w), podFence(t, b))
	}
	ov.check(t)
	for _, name := range ov.names() {
		if !strings.HasPrefix(name, "west/") && !strings.HasPrefix(name, "east/") {
			t.Fatalf("unexpected Pod %s", name)
		}
	}
}

// names are the Pods the watch saw.
func (o *podOverlap) names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for n := range o.running {
		out = append(out, n)
	}
	return out
}

func TestPodThatLosesItsLeaseUnderTerminateIsEvicted(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	dl := makeLock("billing", ns, rdb.Addr).obj()
	dl.Spec.OnLost = locksv1alpha1.OnLostTerminate
	create(t, dl)
	create(t, gatedPodOf("singleton", ns, "billing", nil))
	eventually(t, 10*time.Second, "the Pod to run with the lock", func() (bool, string) {
		r := ungatedPods(t, c, ns)
		return len(r) == 1, fmt.Sprint(r)
	})
	// Someone else takes the key (an operator of the store, a partition
	// that outlasted the TTL): the watchdog's next renewal fails.
	if err := rdb.Client().Del(context.Background(), lockKey(ns, "billing/ledger")).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Pod to be marked lost and evicted", func() (bool, string) {
		var p corev1.Pod
		err := c.Get(context.Background(), nn(ns, "singleton"), &p)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return p.Annotations[locksv1alpha1.AnnotationLost] != "" && p.DeletionTimestamp != nil, fmt.Sprint(p.Annotations, p.DeletionTimestamp)
	})
	// The Event follows the eviction, which the loop above may see first.
	eventually(t, 10*time.Second, "a Terminated Event on the Pod", func() (bool, string) {
		return hasEvent(t, ns, "singleton", locksv1alpha1.EventTerminated)
	})
}

func TestRemovingTheGateIsRefusedToTenants(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	// Another lock on the same key holds it, so the Pod waits.
	create(t, makeLock("other", ns, rdb.Addr).holder("maintenance").obj())
	waitCondition(t, 10*time.Second, ns, "other", locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	create(t, gatedPodOf("waiter", ns, "billing", nil))
	eventually(t, 10*time.Second, "the Pod to wait behind the maintenance window", func() (bool, string) {
		p := getPod(t, c, ns, "waiter")
		return strings.Contains(p.Annotations[locksv1alpha1.AnnotationWaitingFor], "maintenance"), fmt.Sprint(p.Annotations)
	})
	// Without the shipped admission policy (envtest installs none) the
	// operator itself keeps the promise: a Pod ungated behind its back is
	// deleted, never left running without the lock.
	p := getPod(t, c, ns, "waiter")
	p.Spec.SchedulingGates = nil
	if err := c.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the Pod ungated without the lock to be deleted", func() (bool, string) {
		var q corev1.Pod
		err := c.Get(context.Background(), nn(ns, "waiter"), &q)
		return apierrors.IsNotFound(err) || q.DeletionTimestamp != nil, fmt.Sprint(err)
	})
}

// TestWorkloadKeepsItsTokenAcrossARestart: after the operator restarts, a
// new Pod of a holding workload joins the lease its running Pods hold; it
// never acquires another, which would leave them with a stale token.
func TestWorkloadKeepsItsTokenAcrossARestart(t *testing.T) {
	rdb := redistest.Start(t)
	m1 := startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("consumer", ns, rdb.Addr).ttl(restartTTL).obj())
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "consumer-1", Namespace: ns}, Spec: appsv1.ReplicaSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}}}
	create(t, rs)
	owners := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}
	workload := map[string]string{locksv1alpha1.AnnotationHolderMode: "Workload"}
	create(t, gatedPodOf("consumer-1-a", ns, "consumer", workload, owners...))
	eventually(t, 10*time.Second, "the first Pod to run", func() (bool, string) {
		r := ungatedPods(t, c, ns)
		return len(r) == 1, fmt.Sprint(r)
	})
	first := podFence(t, getPod(t, c, ns, "consumer-1-a"))

	m1.stop()
	ttl := restartTTL * time.Second
	waitRenewalMissed(t, rdb.Client(), lockKey(ns, "billing/ledger"), ttl)
	startManager(t, managerOptions{})
	create(t, gatedPodOf("consumer-1-b", ns, "consumer", workload, owners...))
	eventually(t, 10*time.Second, "the new Pod to join the workload's lease", func() (bool, string) {
		r := ungatedPods(t, c, ns)
		return len(r) == 2, fmt.Sprint(r)
	})
	if got := podFence(t, getPod(t, c, ns, "consumer-1-b")); got != first {
		t.Fatalf("the new Pod holds token %d, the running one %d: the workload acquired again", got, first)
	}
	// Past a renewal, the first Pod still holds with its token.
	waitRenewedAfterRestart(t, rdb.Client(), lockKey(ns, "billing/ledger"), ttl)
	if a := getPod(t, c, ns, "consumer-1-a"); a.Annotations[locksv1alpha1.AnnotationLost] != "" || podFence(t, a) != first {
		t.Fatalf("the running Pod was marked lost (%q) or changed token across the restart", a.Annotations[locksv1alpha1.AnnotationLost])
	}
}

// TestBlockedRolloutShowsOnTheLock: a Deployment's new Pod waits for the
// lock its old Pod holds, with maxUnavailable 0: the lock says so
// (RolloutBlocked, and an Event naming the way out).
func TestBlockedRolloutShowsOnTheLock(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("consumer", ns, rdb.Addr).obj())
	zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}},
		Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &zero, MaxSurge: &one}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}}}
	create(t, d)
	// The old and the new ReplicaSet of the rollout, and a Pod of each.
	podOfRS := func(name, hash string) *corev1.Pod {
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "consumer-" + hash, Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
			Spec: appsv1.ReplicaSetSpec{Selector: d.Spec.Selector, Template: d.Spec.Template}}
		create(t, rs)
		p := gatedPodOf(name, ns, "consumer", nil, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)})
		p.Labels = map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: hash, "app": "consumer"}
		return p
	}
	create(t, podOfRS("consumer-old", "old"))
	eventually(t, 10*time.Second, "the old Pod to hold the lock", func() (bool, string) {
		r := ungatedPods(t, c, ns)
		return len(r) == 1, fmt.Sprint(r)
	})
	create(t, podOfRS("consumer-new", "new"))
	dl := waitCondition(t, 15*time.Second, ns, "consumer", locksv1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, locksv1alpha1.EventRolloutBlocked)
	msg := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionRolloutBlocked).Message
	if !containsAll(msg, "Deployment consumer", "consumer-old", "maxUnavailable 0", "at least 1") {
		t.Errorf("RolloutBlocked says %q; want the Deployment, the holding Pod and the way out", msg)
	}
	eventually(t, 5*time.Second, "a RolloutBlocked Event on the lock", func() (bool, string) {
		return hasEvent(t, ns, "consumer", locksv1alpha1.EventRolloutBlocked)
	})
}

// TestPodWhoseLockWentFirstStillReleases: when the lock is deleted before
// its holding Pod (a namespace being deleted deletes both), the Pod still
// releases its lease from what the lease knows, and goes away.
func TestPodWhoseLockWentFirstStillReleases(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, gatedPodOf("singleton", ns, "billing", nil))
	eventually(t, 10*time.Second, "the Pod to run with the lock", func() (bool, string) {
		r := ungatedPods(t, c, ns)
		return len(r) == 1, fmt.Sprint(r)
	})
	if err := c.Delete(context.Background(), getLock(t, ns, "billing")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the lock to be gone", func() (bool, string) {
		err := c.Get(context.Background(), nn(ns, "billing"), &locksv1alpha1.DistributedLock{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	panics := podReconcilePanics(t)
	if err := c.Delete(context.Background(), getPod(t, c, ns, "singleton")); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, c, ns, "singleton")
	eventually(t, 10*time.Second, "the lease to be released in Redis", func() (bool, string) {
		n, err := rdb.Client().Exists(context.Background(), lockKey(ns, "billing/ledger")).Result()
		return err == nil && n == 0, fmt.Sprint(n, err)
	})
	if n := podReconcilePanics(t); n != panics {
		t.Fatalf("the Pod controller panicked %v times releasing the Pod", n-panics)
	}
}

// podReconcilePanics reads controller-runtime's count of the Pod
// controller's reconciles that panicked (and were recovered).
func podReconcilePanics(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_panics_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "pod" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
