//go:build perf

package perf

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
)

// job returns a Job gated by lock whose Pod "runs" for runFor on the kwok node.
func job(ns, name, lockName string, runFor time.Duration) *batchv1.Job {
	d := runFor.String()
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"lockwarden.io/lock": lockName}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
					"pod-complete.stage.kwok.x-k8s.io/delay":        d,
					"pod-complete.stage.kwok.x-k8s.io/jitter-delay": d,
				}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
				},
			},
		},
	}
}

func createLock(t *testing.T, ns, name string, contention locksv1alpha1.Contention) {
	t.Helper()
	if err := cluster.Client.Create(context.Background(), &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:       []string{name},
			Contention: contention,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: cluster.RedisAddrs()}},
		},
	}); err != nil {
		t.Fatal(err)
	}
}

// TestAdmissionLatency creates gated Jobs, 50 at a time, and reports the
// latency of the create call (API server and webhook) and the webhook's own
// handling time from the operator's controller_runtime_webhook_latency_seconds.
func TestAdmissionLatency(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "admission")
	// Skip: one Job holds, the others are marked skipped; the operator does
	// little besides admitting them.
	createLock(t, ns, "adm", locksv1alpha1.ContentionSkip)
	const concurrency = 50
	rounds := envInt(t, "PERF_ADMISSION_ROUNDS", 6)
	// A client without client-go's default rate limit (5 QPS), which would
	// otherwise be what this measures.
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 1000, 1000
	c, err := client.New(cfg, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	createAll := func(prefix string, gated bool) []time.Duration {
		var mu sync.Mutex
		var samples []time.Duration
		for r := range rounds {
			var wg sync.WaitGroup
			for i := range concurrency {
				wg.Add(1)
				go func() {
					defer wg.Done()
					j := job(ns, fmt.Sprintf("%s-%d-%d", prefix, r, i), "adm", time.Hour)
					if !gated {
						delete(j.Annotations, "lockwarden.io/lock")
						j.Spec.Suspend = ptr.To(true) // nothing to run; only the create is measured
					}
					start := time.Now()
					if err := c.Create(ctx, j); err != nil {
						t.Error(err)
						return
					}
					d := time.Since(start)
					mu.Lock()
					samples = append(samples, d)
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		return samples
	}
	// The same creates without the webhook (no lock annotation: matchConditions
	// keep them away from it), for the API server's own share.
	base50, base99 := quantiles(createAll("plain", false))
	report.add("Job create, no webhook (baseline)", fmt.Sprintf("%d unrelated Jobs, %d concurrent", rounds*concurrency, concurrency), base50, base99)
	samples := createAll("adm", true)
	p50, p99 := quantiles(samples)
	report.add("Job create through the webhook (client side)", fmt.Sprintf("%d gated Jobs, %d concurrent", len(samples), concurrency), p50, p99)
	om := scrape(t, cluster.MetricsURL, nil)
	hook := map[string]string{"webhook": "/mutate-batch-v1-job"}
	sp50 := time.Duration(om.histogramQuantile("controller_runtime_webhook_latency_seconds", hook, 0.5) * float64(time.Second))
	sp99 := time.Duration(om.histogramQuantile("controller_runtime_webhook_latency_seconds", hook, 0.99) * float64(time.Second))
	report.add("Webhook handling (server side, from its histogram)", "same requests; interpolated within histogram buckets", sp50, sp99)
	t.Logf("admission: create p50 %v p99 %v; webhook p50 ≈%v p99 ≈%v", p50, p99, sp50, sp99)
	deleteNamespace(t, ns)
}

// jobWatch timestamps what one namespace's Jobs do.
type jobWatch struct {
	mu       sync.Mutex
	complete map[string]time.Time
	started  map[string]time.Time
	stop     func()
}

func watchJobs(t *testing.T, ns string) *jobWatch {
	t.Helper()
	wc, err := client.NewWithWatch(cluster.Config, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &batchv1.JobList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	jw := &jobWatch{complete: map[string]time.Time{}, started: map[string]time.Time{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			jw.mu.Lock()
			if _, seen := jw.started[j.Name]; !seen && j.Spec.Suspend != nil && !*j.Spec.Suspend {
				jw.started[j.Name] = now
			}
			for _, c := range j.Status.Conditions {
				if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
					if _, seen := jw.complete[j.Name]; !seen {
						jw.complete[j.Name] = now
					}
				}
			}
			jw.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return jw
}

func (jw *jobWatch) waitStarted(t *testing.T, name string, timeout time.Duration) time.Time {
	t.Helper()
	return jw.waitRecorded(t, jw.started, "start", name, timeout)
}

func (jw *jobWatch) completedAt(t *testing.T, name string, timeout time.Duration) time.Time {
	t.Helper()
	return jw.waitRecorded(t, jw.complete, "complete", name, timeout)
}

// waitRecorded waits until the watch has recorded the Job in m and returns when it did.
func (jw *jobWatch) waitRecorded(t *testing.T, m map[string]time.Time, what, name string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		jw.mu.Lock()
		at, ok := m[name]
		jw.mu.Unlock()
		if ok {
			return at
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's record, which the watch goroutine fills in
	}
	t.Fatalf("Job %s did not %s within %v", name, what, timeout)
	return time.Time{}
}

// TestHandoverSameCluster chains Jobs on one lock: each Pod runs for a
// second on the kwok node; the handover is the time from the API server
// reporting the holder Job Complete to the next Job unsuspended.
func TestHandoverSameCluster(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "handover")
	createLock(t, ns, "chain", locksv1alpha1.ContentionQueue)
	jw := watchJobs(t, ns)
	n := envInt(t, "PERF_HANDOVERS", 20)
	for i := range n + 1 {
		if err := cluster.Client.Create(ctx, job(ns, fmt.Sprintf("chain-%02d", i), "chain", time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	var samples []time.Duration
	for i := range n {
		jw.waitStarted(t, fmt.Sprintf("chain-%02d", i), 2*time.Minute)
		done := jw.completedAt(t, fmt.Sprintf("chain-%02d", i), 2*time.Minute)
		next := jw.waitStarted(t, fmt.Sprintf("chain-%02d", i+1), 2*time.Minute)
		samples = append(samples, next.Sub(done))
	}
	p50, p99 := quantiles(samples)
	report.add("Handover, holder in this cluster", fmt.Sprintf("%d Jobs in a chain: holder Complete → next Job unsuspended (as a watch sees both)", n), p50, p99)
	t.Logf("handover (same cluster): p50 %v p99 %v", p50, p99)
	deleteNamespace(t, ns)
}

// TestHandoverFromAnotherCluster: a holder outside this cluster (another
// lockwarden engine on the same Redis, as a second cluster's operator would
// be) holds the key; a Job waits; the handover is the time from the foreign
// release to the Job unsuspended.
func TestHandoverFromAnotherCluster(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "remote")
	createLock(t, ns, "shared", locksv1alpha1.ContentionQueue)
	jw := watchJobs(t, ns)
	other, err := redislock.New(redislock.Config{Addrs: cluster.RedisAddrs(), Prefix: backend.KeyPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	key := backend.EngineKey(ns, locksv1alpha1.ScopeNamespace, "shared")
	n := envInt(t, "PERF_HANDOVERS", 20)
	var samples []time.Duration
	for i := range n {
		owner, err := lock.NewOwnerToken()
		if err != nil {
			t.Fatal(err)
		}
		lease, err := other.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: owner, Holder: "lockwarden/v1|other-cluster|" + ns + "|shared|Job|remote|uid|other-cluster/remote", Queue: true})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("remote-%02d", i)
		if err := cluster.Client.Create(ctx, job(ns, name, "shared", time.Second)); err != nil {
			t.Fatal(err)
		}
		// The Job is queued behind the foreign holder before it is released.
		waitQueued(t, ns, "shared")
		start := time.Now()
		if err := other.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, jw.waitStarted(t, name, time.Minute).Sub(start))
		jw.completedAt(t, name, 2*time.Minute)
	}
	p50, p99 := quantiles(samples)
	report.add("Handover, holder in another cluster", fmt.Sprintf("%d times: foreign release on the shared Redis → waiting Job unsuspended", n), p50, p99)
	t.Logf("handover (other cluster): p50 %v p99 %v", p50, p99)
	deleteNamespace(t, ns)
}

// waitQueued waits until the lock's status lists a waiter.
func waitQueued(t *testing.T, ns, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var dl locksv1alpha1.DistributedLock
		if err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &dl); err == nil && len(dl.Status.Waiting) > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond) // polling the API server
	}
	t.Fatalf("no waiter on %s/%s within 30s", ns, name)
}
