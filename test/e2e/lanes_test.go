//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestLanesOneDeployPerEnvironment applies the lanes sample's lock (a key
// per label env, maxHolders 1) and creates 4 Jobs in each of 3
// environments: at every event of a watch on their Pods at most one Pod per
// environment runs, the environments run in parallel, each lane's fencing
// tokens rise, and a Job without the label, or a key past maxKeys, is
// refused at admission with a message that names the lock.
func TestLanesOneDeployPerEnvironment(t *testing.T) {
	ns := newNamespace(t, "e2e-lanes")
	data, err := os.ReadFile(filepath.Join(cluster.Root, "config", "samples", "locks_v1alpha1_distributedlock_lanes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lockDoc, _, _ := strings.Cut(string(data), "\n---\n") // the lock; the sample's Job is for users
	kubectl(t, lockDoc, "apply", "-n", ns, "-f", "-")
	rec := recordLanes(t, ns)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get jobs,pods,dlock:\n%s", kubectl(t, "", "get", "jobs,pods,dlock", "-n", ns, "-o", "wide"))
		}
	})

	envs := []string{"dev", "staging", "prod"}
	for i := range 4 {
		for _, env := range envs {
			if err := cluster.Client.Create(t.Context(), laneJob(ns, fmt.Sprintf("deploy-%s-%d", env, i), env, 3*time.Second)); err != nil {
				t.Fatalf("create Job: %v", err)
			}
		}
	}
	waitFor(t, 2*time.Minute, "the lock to show its three lanes", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "deploys")
		if err != nil || dl.Status.Lanes == nil {
			return false, err
		}
		return dl.Status.Lanes.Keys == 3 && dl.Status.Lanes.Holders >= 1 && len(dl.Status.Lanes.Busiest) > 0, nil
	})
	waitFor(t, 4*time.Minute, "the 12 Jobs to complete", func(ctx context.Context) (bool, error) {
		var jobs batchv1.JobList
		if err := cluster.Client.List(ctx, &jobs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		done := 0
		for i := range jobs.Items {
			if finished(&jobs.Items[i]) {
				done++
			}
		}
		return done == 12, nil
	})
	samples, overlaps, parallel, tokens := rec.result()
	t.Logf("lanes: %d samples (Pod events), %d with two Pods of one environment running, %d with two or more environments running at once", samples, overlaps, parallel)
	if overlaps != 0 {
		t.Errorf("%d samples had two Pods of one environment running: %v", overlaps, rec.overlapList())
	}
	if parallel == 0 {
		t.Errorf("no sample had two environments running at once: the lanes did not run in parallel")
	}
	for _, env := range envs {
		if got := tokens[env]; len(got) != 4 || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != 4 || got[0] == 0 {
			t.Errorf("environment %s ran with fencing tokens %v in start order, want 4 rising tokens", env, got)
		}
	}

	// A Job without the label: refused, with the lock, its expression and what is missing.
	err = cluster.Client.Create(t.Context(), laneJob(ns, "deploy-nowhere", "", time.Second))
	for _, want := range []string{"lock deploys", "spec.keyFrom.matches", `object.metadata.labels["env"]`, "no such key: env"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a Job without the label env: %v, want a refusal with %q", err, want)
		}
	}
	if err != nil {
		t.Logf("a Job without the label env is refused: %v", err)
	}

	// maxKeys: a lock with 2 derived keys in use refuses a third.
	builds := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "builds"},
		Spec: locksv1alpha1.DistributedLockSpec{
			KeyFrom:    &locksv1alpha1.KeyFrom{Expression: `"build/" + object.metadata.labels["branch"]`},
			MaxKeys:    2,
			TTLSeconds: 30,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: cluster.RedisAddrs()}},
		},
	}
	if err := cluster.Client.Create(t.Context(), builds); err != nil {
		t.Fatal(err)
	}
	for _, branch := range []string{"main", "release"} {
		j := laneJob(ns, "build-"+branch, "", time.Minute)
		j.Annotations[locksv1alpha1.AnnotationLock] = "builds"
		j.Labels = map[string]string{"branch": branch}
		if err := cluster.Client.Create(t.Context(), j); err != nil {
			t.Fatalf("create Job of branch %s: %v", branch, err)
		}
	}
	third := laneJob(ns, "build-feature", "", time.Minute)
	third.Annotations[locksv1alpha1.AnnotationLock] = "builds"
	third.Labels = map[string]string{"branch": "feature"}
	waitFor(t, time.Minute, "a third branch to be refused past maxKeys 2", func(ctx context.Context) (bool, error) {
		err := cluster.Client.Create(ctx, third.DeepCopy())
		if err == nil {
			return false, fmt.Errorf("a third key was admitted past maxKeys 2")
		}
		return strings.Contains(err.Error(), "already has 2 derived keys in use (spec.maxKeys 2"), nil
	})
	t.Logf("a third key past maxKeys 2 is refused")
	// A bad expression is refused when the lock is applied.
	bad := builds.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "bad"}
	bad.Spec.KeyFrom = &locksv1alpha1.KeyFrom{Expression: `object.metadata.labels["env"] + 1`}
	if err := cluster.Client.Create(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "spec.keyFrom.expression") {
		t.Errorf("a lock whose expression does not compile: %v, want a refusal naming spec.keyFrom.expression", err)
	}
}

// laneJob returns a Job of the lock deploys labelled env (none when
// empty) whose Pod runs for runFor under kwok.
func laneJob(ns, name, env string, runFor time.Duration) *batchv1.Job {
	d := runFor.String()
	labels := map[string]string{}
	if env != "" {
		labels["env"] = env
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{locksv1alpha1.AnnotationLock: "deploys"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{kwokCompleteDelay: d, kwokCompleteJitter: d}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "deploy", Image: "busybox:1.37", Command: []string{"true"}}},
				},
			},
		},
	}
}

// laneRecorder watches a namespace's Pods and counts, at every event, the
// Pods running per environment (label env).
type laneRecorder struct {
	mu                          sync.Mutex
	running                     map[string]map[string]bool // env -> running Pods
	started                     map[string]bool
	samples, overlaps, parallel int
	overlapsSeen                []string
	tokens                      map[string][]int64 // env -> tokens in start order
}

func recordLanes(t *testing.T, ns string) *laneRecorder {
	t.Helper()
	r := &laneRecorder{running: map[string]map[string]bool{}, started: map[string]bool{}, tokens: map[string][]int64{}}
	watchPods(t, ns, func(_ context.Context, typ watch.EventType, pod *corev1.Pod) { r.observe(typ, pod) },
		func(err error) { t.Errorf("%v", err) })
	return r
}

func (r *laneRecorder) observe(typ watch.EventType, pod *corev1.Pod) {
	env := pod.Labels["env"]
	if env == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[env] == nil {
		r.running[env] = map[string]bool{}
	}
	if typ != watch.Deleted && pod.Status.Phase == corev1.PodRunning {
		if !r.started[pod.Name] {
			r.started[pod.Name] = true
			token, _ := strconv.ParseInt(pod.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
			r.tokens[env] = append(r.tokens[env], token)
		}
		r.running[env][pod.Name] = true
	} else {
		delete(r.running[env], pod.Name)
	}
	r.samples++
	busy := 0
	for e, pods := range r.running {
		if len(pods) > 1 {
			r.overlaps++
			r.overlapsSeen = append(r.overlapsSeen, fmt.Sprintf("%s: %v", e, pods))
		}
		if len(pods) > 0 {
			busy++
		}
	}
	if busy > 1 {
		r.parallel++
	}
}

func (r *laneRecorder) result() (samples, overlaps, parallel int, tokens map[string][]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tokens = map[string][]int64{}
	for e, ts := range r.tokens {
		tokens[e] = slices.Clone(ts)
	}
	return r.samples, r.overlaps, r.parallel, tokens
}

func (r *laneRecorder) overlapList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.overlapsSeen)
}
