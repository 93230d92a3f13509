package monitoring

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// synthetic are the series Prometheus makes itself for every target, which
// no /metrics endpoint exports.
var synthetic = map[string]bool{"up": true}

// TestEveryQueriedMetricIsExported drives the manager through what a cluster
// does every day (a lock acquired by a Job through the webhook, a second Job
// queued behind it and then run, renewals, a lease lost when its key
// vanishes) and then checks that every metric an alert or a dashboard panel
// queries is on /metrics: a renamed metric, or a typo in a query, leaves a
// panel empty and an alert silent forever.
func TestEveryQueriedMetricIsExported(t *testing.T) {
	needEnv(t)
	qs := queries(t)
	rdb := redistest.Start(t)
	ctx := t.Context()
	c := env.Client
	ns := newNamespace(t)

	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys: []string{"billing/ledger"},
			// The shortest TTL: renewed about every 1.7 s.
			TTLSeconds: 5,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	}
	if err := c.Create(ctx, dl); err != nil {
		t.Fatalf("create DistributedLock: %v", err)
	}

	// The first Job acquires the lock and runs; the second queues behind it.
	first := createJob(t, ns, "first", "billing")
	waitFor(t, "Job first to run with a fencing token", func(ctx context.Context) (bool, error) {
		return running(ctx, first)
	})
	second := createJob(t, ns, "second", "billing")
	var waiterSince time.Time
	waitFor(t, "Job second to wait in the lock's queue", func(ctx context.Context) (bool, error) {
		var got locksv1alpha1.DistributedLock
		if err := c.Get(ctx, client.ObjectKeyFromObject(dl), &got); err != nil {
			return false, err
		}
		if len(got.Status.Waiting) == 0 || got.Status.Waiting[0].Since == nil {
			return false, nil
		}
		waiterSince = got.Status.Waiting[0].Since.Time
		return true, nil
	})

	// The oldest waiter's age is exported as the time it joined the queue,
	// the same time the lock's status shows (to the second), so that
	// time() minus it is how long it has waited.
	waitFor(t, "lockwarden_queue_oldest_waiter_timestamp_seconds to show Job second", func(ctx context.Context) (bool, error) {
		v, ok, err := lockGauge(ctx, "lockwarden_queue_oldest_waiter_timestamp_seconds", ns, "billing")
		return ok && v > 0, err
	})
	v, _, err := lockGauge(ctx, "lockwarden_queue_oldest_waiter_timestamp_seconds", ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(v - float64(waiterSince.Unix())); d >= 1 {
		t.Errorf("lockwarden_queue_oldest_waiter_timestamp_seconds = %.3f, want the waiter's status since %s (%d), within a second",
			v, waiterSince.UTC().Format(time.RFC3339), waiterSince.Unix())
	}

	waitFor(t, "a lease renewal", func(ctx context.Context) (bool, error) {
		fams, err := scrape(ctx)
		return fams["lockwarden_renewals_total"] != nil, err
	})

	// The first Job ends (deleted): its lease is released and the second
	// Job acquires it; the queue is empty again.
	if err := c.Delete(ctx, first, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete Job first: %v", err)
	}
	waitFor(t, "Job second to run after Job first was deleted", func(ctx context.Context) (bool, error) {
		return running(ctx, second)
	})
	waitFor(t, "lockwarden_queue_oldest_waiter_timestamp_seconds to drop to 0 once nobody waits", func(ctx context.Context) (bool, error) {
		v, ok, err := lockGauge(ctx, "lockwarden_queue_oldest_waiter_timestamp_seconds", ns, "billing")
		return ok && v == 0, err
	})

	// The second Job's lease vanishes from Redis (as after a failover to a
	// replica that had not seen it): the next renewal finds it lost.
	if err := rdb.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	waitFor(t, "the lost lease to be counted", func(ctx context.Context) (bool, error) {
		fams, err := scrape(ctx)
		return fams["lockwarden_leases_lost_total"] != nil, err
	})

	fams, err := scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if missing := missingMetrics(qs, fams); len(missing) > 0 {
		t.Errorf("%d queries use metrics the manager does not export (exported: %s):\n%s",
			len(missing), strings.Join(familyNames(fams), " "), strings.Join(missing, "\n"))
	}
}

// missingMetrics returns one line for each metric name of a query that is
// not in fams (a histogram's _bucket, _sum and _count series count as its
// family), naming the query.
func missingMetrics(qs []query, fams map[string]*dto.MetricFamily) []string {
	var out []string
	for _, q := range qs {
		for _, name := range metricNames(q.expr) {
			if !exported(name, fams) {
				out = append(out, fmt.Sprintf("  %s in %s", name, q.where))
			}
		}
	}
	return out
}

// exported reports whether the series name is in fams.
func exported(name string, fams map[string]*dto.MetricFamily) bool {
	if synthetic[name] || fams[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok || fams[base] == nil {
			continue
		}
		switch fams[base].GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suffix != "_bucket"
		}
	}
	return false
}

func TestMissingMetrics(t *testing.T) {
	fams := map[string]*dto.MetricFamily{
		"lockwarden_wait_seconds":       {Type: dto.MetricType_HISTOGRAM.Enum()},
		"lockwarden_acquisitions_total": {Type: dto.MetricType_COUNTER.Enum()},
		"go_gc_duration_seconds":        {Type: dto.MetricType_SUMMARY.Enum()},
	}
	qs := []query{
		{where: "ok", expr: `histogram_quantile(0.9, rate(lockwarden_wait_seconds_bucket[5m])) + rate(lockwarden_wait_seconds_count[5m]) + up`},
		{where: "ok too", expr: `rate(go_gc_duration_seconds_sum[5m]) / rate(lockwarden_acquisitions_total[5m])`},
		{where: "typo", expr: `rate(lockwarden_aquisitions_total[5m])`},
		{where: "not a histogram", expr: `lockwarden_acquisitions_total_count + go_gc_duration_seconds_bucket`},
	}
	want := []string{
		"  lockwarden_aquisitions_total in typo",
		"  go_gc_duration_seconds_bucket in not a histogram",
		"  lockwarden_acquisitions_total_count in not a histogram",
	}
	got := missingMetrics(qs, fams)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("missingMetrics = %q, want %q", got, want)
	}
}

// scrape reads and parses the manager's /metrics.
func scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("GET %s: %s: %s", metricsURL, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", metricsURL, err)
	}
	return fams, nil
}

// lockGauge returns the value of a per-lock gauge for namespace/lock, and
// whether it is exported.
func lockGauge(ctx context.Context, name, namespace, lock string) (float64, bool, error) {
	fams, err := scrape(ctx)
	if err != nil {
		return 0, false, err
	}
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == namespace && labels["lock"] == lock {
			return m.GetGauge().GetValue(), true, nil
		}
	}
	return 0, false, nil
}

func familyNames(fams map[string]*dto.MetricFamily) []string {
	var names []string
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// createJob creates a Job that names lock, as a user would; the webhook
// gates it.
func createJob(t *testing.T, namespace, name, lock string) *batchv1.Job {
	t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	if err := env.Client.Create(t.Context(), job); err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	return job
}

// running reports whether lockwarden started the Job: unsuspended, with a
// fencing token.
func running(ctx context.Context, job *batchv1.Job) (bool, error) {
	var j batchv1.Job
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: job.Name}, &j); err != nil {
		return false, err
	}
	return j.Spec.Suspend != nil && !*j.Spec.Suspend && j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] != "", nil
}

// newNamespace creates a namespace with a fresh name for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "monitoring-"}}
	if err := env.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// waitFor polls cond every 100 ms until it holds, failing the test after a
// minute with the last error cond returned.
func waitFor(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
	}
}
