//go:build perf

package perf

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func inNamespace(ns string) client.InNamespace { return client.InNamespace(ns) }

func newNamespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "perf-" + name}}
	if err := cluster.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// deleteNamespace deletes ns, waits until it is gone (its locks released)
// and returns how long that took.
func deleteNamespace(t *testing.T, ns string) time.Duration {
	t.Helper()
	ctx := context.Background()
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	start := time.Now()
	if err := cluster.Client.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		var left locksv1alpha1.DistributedLockList
		_ = cluster.Client.List(ctx, &left, client.InNamespace(ns))
		t.Fatalf("namespace %s was not deleted within 30m: %d DistributedLocks left", ns, len(left.Items))
	}
	return time.Since(start)
}

// lockWatch observes one DistributedLock and timestamps what it sees.
type lockWatch struct{ w watch.Interface }

func watchLock(t *testing.T, ns, name string) *lockWatch {
	t.Helper()
	wc, err := client.NewWithWatch(cluster.Config, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns),
		client.MatchingFields{"metadata.name": name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return &lockWatch{w: w}
}

// until returns when the lock first satisfies cond, as seen by the watch.
func (lw *lockWatch) until(t *testing.T, timeout time.Duration, cond func(*locksv1alpha1.DistributedLock) bool) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-lw.w.ResultChan():
			if dl, ok := ev.Object.(*locksv1alpha1.DistributedLock); ok && cond(dl) {
				return time.Now()
			}
		case <-deadline:
			t.Fatalf("condition not seen within %v", timeout)
		}
	}
}

// metrics is a scraped Prometheus text page.
type metrics map[string]*dto.MetricFamily

func scrape(t *testing.T, url string, hc *http.Client) metrics {
	t.Helper()
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return metrics(mf)
}

func scrapeAPIServer(t *testing.T) metrics {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return metrics(mf)
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// sum adds the counters (or gauges) of a family whose labels match.
func (ms metrics) sum(name string, want map[string]string) float64 {
	var total float64
	for _, m := range ms[name].GetMetric() {
		if !labelsMatch(m, want) {
			continue
		}
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

// sumWrites adds the API server's write requests, for one resource or all.
func (ms metrics) sumWrites(resource string) float64 {
	var total float64
	for _, m := range ms["apiserver_request_total"].GetMetric() {
		var verb, res string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "verb":
				verb = l.GetValue()
			case "resource":
				res = l.GetValue()
			}
		}
		if resource != "" && res != resource {
			continue
		}
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE":
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// histogramQuantile estimates a quantile from the buckets of a histogram
// family (matching labels), as Prometheus' histogram_quantile does.
func (ms metrics) histogramQuantile(name string, want map[string]string, q float64) float64 {
	type bucket struct{ le, count float64 }
	var buckets []bucket
	var total float64
	for _, m := range ms[name].GetMetric() {
		if !labelsMatch(m, want) {
			continue
		}
		h := m.GetHistogram()
		for i, b := range h.GetBucket() {
			if i >= len(buckets) {
				buckets = append(buckets, bucket{le: b.GetUpperBound()})
			}
			buckets[i].count += float64(b.GetCumulativeCount())
		}
		total += float64(h.GetSampleCount())
	}
	if total == 0 {
		return 0
	}
	rank := q * total
	prevLE, prevCount := 0.0, 0.0
	for _, b := range buckets {
		if b.count >= rank {
			if b.count == prevCount {
				return b.le
			}
			return prevLE + (b.le-prevLE)*(rank-prevCount)/(b.count-prevCount)
		}
		prevLE, prevCount = b.le, b.count
	}
	return prevLE
}

// reportBuilder collects the figures of a run.
type reportBuilder struct {
	mu      sync.Mutex
	header  []string
	steady  []steadyRow
	latency []string
}

type steadyRow struct {
	leases          int
	heldAfter       time.Duration
	cpuCores        float64
	peakRSSMiB      float64
	redisCmdsPerSec float64
	redisCallsPerS  float64
	redisReadsPerS  float64
	batchesPerSec   float64
	resyncPerSec    float64
	renewalsPerSec  float64
	renewalsDue     float64
	nsDeletion      time.Duration
	apiWritesPerSec float64
	lockWritesPerS  float64
}

func (r *reportBuilder) machine() {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	redisVersion, _ := exec.Command("redis-server", "--version").Output()
	r.header = append(r.header,
		fmt.Sprintf("- Machine: %d CPUs (%s), %s/%s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version()),
		"- Redis: "+strings.TrimSpace(string(redisVersion)),
		"- Run at: "+time.Now().UTC().Format(time.RFC3339),
		"- Everything (etcd, kube-apiserver, kube-controller-manager, kwok, Redis, the operator, the harness) on this one machine.",
	)
}

func (r *reportBuilder) addSteady(row steadyRow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steady = append(r.steady, row)
}

func (r *reportBuilder) add(what, how string, p50, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latency = append(r.latency, fmt.Sprintf("| %s | %s | %v | %v |", what, how, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond)))
}

func (r *reportBuilder) write(path string) error {
	var b strings.Builder
	b.WriteString("# lockwarden load harness report\n\n")
	b.WriteString(strings.Join(r.header, "\n") + "\n\n")
	if len(r.steady) > 0 {
		b.WriteString("## Steady state (TTL 30 s, renewals every ~10 s)\n\n")
		b.WriteString("| leases | all held after | operator CPU (cores) | operator peak RSS (MiB) | renewals/s | renewals due/s | renewal round trips/s | status resync round trips/s | Redis commands/s (incl. inside scripts) | Redis client calls/s | Redis socket reads/s | API writes/s (all clients) | DistributedLock writes/s | namespace deletion |\n")
		b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, s := range r.steady {
			fmt.Fprintf(&b, "| %d | %v | %.3f | %.0f | %.0f | %.0f | %.2f | %.3f | %.0f | %.1f | %.1f | %.2f | %.2f | %v |\n",
				s.leases, s.heldAfter.Round(time.Second), s.cpuCores, s.peakRSSMiB, s.renewalsPerSec, s.renewalsDue,
				s.batchesPerSec, s.resyncPerSec, s.redisCmdsPerSec, s.redisCallsPerS, s.redisReadsPerS,
				s.apiWritesPerSec, s.lockWritesPerS, s.nsDeletion.Round(time.Second))
		}
		b.WriteString("\n- Renewals due/s: every lease is renewed a third of its TTL after the last renewal (leases × 3 / TTL).\n")
		b.WriteString("- Round trips: renewal and status resync round trips are the operator's batches (lockwarden_renewal_batches_total, lockwarden_status_resync_batches_total; one pipeline per Redis node each). Redis socket reads (INFO total_reads_processed) count every client's round trips from Redis's side, the harness's INFO calls included; a pipeline larger than 16 KiB counts once per 16 KiB read.\n")
		b.WriteString("- Namespace deletion: from the DELETE of the namespace to its disappearance; each lock releases its lease before its finalizer is removed.\n\n")
	}
	if len(r.latency) > 0 {
		b.WriteString("## Latencies\n\n| what | how | p50 | p99 |\n| --- | --- | --- | --- |\n")
		b.WriteString(strings.Join(r.latency, "\n") + "\n")
	}
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		return path[:i]
	}
	return "."
}
