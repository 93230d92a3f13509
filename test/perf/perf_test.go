//go:build perf

// Package perf is lockwarden's load harness: one local cluster
// (internal/testutil/devcluster: etcd, kube-apiserver, kube-controller-manager, a kwok
// node, Redis and the operator binary as processes on this machine) and a set
// of measurements, written as a Markdown report to $PERF_REPORT (default
// bin/perf-report.md).
//
//	make perf                            # everything
//	PERF_LEASES=1000 make perf           # steady state with 1000 leases only
//
// Nothing here asserts a speed: the harness measures and reports. It fails
// only when the system does something wrong (a lease not held, a Job not
// started).
package perf

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	goredis "github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
)

var (
	cluster *devcluster.Cluster
	report  = &reportBuilder{}
	// pprofURL is the operator's profiler (--pprof-bind-address).
	pprofURL string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "lockwarden-perf-")
	if err != nil {
		log.Print(err)
		return 1
	}
	defer os.RemoveAll(dir)
	pprofPort, err := freeport.Take()
	if err != nil {
		log.Print(err)
		return 1
	}
	pprofURL = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof", pprofPort)
	c, err := devcluster.StartFromSource(ctx, dir, devcluster.Options{
		Logf:        func(format string, args ...any) { log.Printf("[cluster] "+format, args...) },
		ManagerArgs: []string{fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", pprofPort)},
	})
	if err != nil {
		log.Printf("start the cluster: %v", err)
		return 1
	}
	defer c.Stop()
	cluster = c
	report.machine()
	code := m.Run()
	path := os.Getenv("PERF_REPORT")
	if path == "" {
		path = filepath.Join(c.Root, "bin", "perf-report.md")
	}
	if err := report.write(path); err != nil {
		log.Print(err)
		return 1
	}
	log.Printf("report written to %s", path)
	return code
}

// steadyTTL is the TTL of the steady state's leases: the watchdog renews
// each a third of it after the last renewal.
const steadyTTL = 30

// TestSteadyState holds N leases (TTL 30 s) and measures the operator's CPU
// and peak memory, Redis traffic and API writes over a quiet window, then
// the deletion of the namespace of the N locks (each releases its lease
// before its finalizer goes). With PERF_PROFILE set, the operator's CPU
// profile over the window and its heap after it are written beside the
// report (bin/perf-<N>-cpu.pprof, bin/perf-<N>-heap.pprof).
func TestSteadyState(t *testing.T) {
	window := envDuration(t, "PERF_WINDOW", 60*time.Second)
	for _, n := range envInts(t, "PERF_LEASES", []int{1000, 5000}) {
		t.Run(fmt.Sprintf("leases=%d", n), func(t *testing.T) {
			ctx := context.Background()
			ns := newNamespace(t, fmt.Sprintf("steady-%d", n))
			start := time.Now()
			parallel(t, n, 16, func(i int) error {
				return cluster.Client.Create(ctx, &locksv1alpha1.DistributedLock{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("l%05d", i), Namespace: ns},
					Spec: locksv1alpha1.DistributedLockSpec{
						Keys:       []string{fmt.Sprintf("key-%05d", i)},
						TTLSeconds: steadyTTL,
						Holder:     &locksv1alpha1.ManualHolder{Identity: fmt.Sprintf("holder-%05d", i)},
						Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: cluster.RedisAddrs()}},
					},
				})
			})
			// Creation runs at a few dozen locks a second here: 50,000 take
			// about 25 minutes.
			waitHeld(t, ns, n, 15*time.Minute+time.Duration(n)*30*time.Millisecond)
			held := time.Since(start)
			// Let the acquisitions' status writes and Events drain.
			time.Sleep(10 * time.Second) // a settling period before the measured window, not a wait for a result

			before := sample(t)
			profiled := make(chan struct{})
			if os.Getenv("PERF_PROFILE") != "" {
				go func() {
					defer close(profiled)
					saveProfile(t, fmt.Sprintf("profile?seconds=%d", int(window.Seconds())), fmt.Sprintf("perf-%d-cpu.pprof", n))
				}()
			} else {
				close(profiled)
			}
			time.Sleep(window) // the measured window
			after := sample(t)
			<-profiled
			if os.Getenv("PERF_PROFILE") != "" {
				saveProfile(t, "heap", fmt.Sprintf("perf-%d-heap.pprof", n))
			}
			d := after.diff(before)
			secs := window.Seconds()
			row := steadyRow{
				leases:          n,
				heldAfter:       held,
				cpuCores:        d.cpuSeconds / secs,
				peakRSSMiB:      float64(after.peakRSSKiB) / 1024,
				redisCmdsPerSec: float64(d.redisCommands) / secs,
				redisCallsPerS:  float64(d.redisClientCalls) / secs,
				redisReadsPerS:  float64(d.redisReads) / secs,
				batchesPerSec:   d.batches / secs,
				resyncPerSec:    d.resyncBatches / secs,
				renewalsPerSec:  d.renewals / secs,
				renewalsDue:     float64(n) * 3 / steadyTTL,
				apiWritesPerSec: d.apiWrites / secs,
				lockWritesPerS:  d.lockWrites / secs,
			}
			t.Logf("%d leases: %.3f cores, peak RSS %.0f MiB, Redis %.0f cmd/s (%.1f client calls/s, %.1f socket reads/s), %.2f renewal round trips/s for %.0f renewals/s (%.0f/s due), %.3f status resync batches/s, API writes %.2f/s (DistributedLocks %.2f/s)",
				n, row.cpuCores, row.peakRSSMiB, row.redisCmdsPerSec, row.redisCallsPerS, row.redisReadsPerS,
				row.batchesPerSec, row.renewalsPerSec, row.renewalsDue, row.resyncPerSec, row.apiWritesPerSec, row.lockWritesPerS)

			// Every lease is still held: renewals kept them.
			waitHeld(t, ns, n, time.Minute)
			row.nsDeletion = deleteNamespace(t, ns)
			report.addSteady(row)
			t.Logf("%d leases: namespace deleted (every lock released, its finalizer removed) in %v", n, row.nsDeletion.Round(time.Second))
		})
	}
}

// TestApplyToHeld measures the time from creating a lock with a manual holder
// to its Held=True condition, as `kubectl apply` then `kubectl wait` sees it.
func TestApplyToHeld(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "apply")
	var samples []time.Duration
	for i := range envInt(t, "PERF_APPLY_SAMPLES", 30) {
		name := fmt.Sprintf("apply-%d", i)
		w := watchLock(t, ns, name)
		start := time.Now()
		if err := cluster.Client.Create(ctx, &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: locksv1alpha1.DistributedLockSpec{
				Keys:    []string{name},
				Holder:  &locksv1alpha1.ManualHolder{Identity: "maintenance"},
				Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: cluster.RedisAddrs()}},
			},
		}); err != nil {
			t.Fatal(err)
		}
		at := w.until(t, 30*time.Second, func(dl *locksv1alpha1.DistributedLock) bool {
			return meta.IsStatusConditionTrue(dl.Status.Conditions, locksv1alpha1.ConditionHeld)
		})
		samples = append(samples, at.Sub(start))
	}
	p50, p99 := quantiles(samples)
	report.add("Apply to Held=True", fmt.Sprintf("%d locks created one after another", len(samples)), p50, p99)
	t.Logf("apply → Held=True: p50 %v, p99 %v", p50, p99)
	deleteNamespace(t, ns)
}

// sampleValues are cumulative counters read at one moment.
type sampleValues struct {
	cpuSeconds       float64
	peakRSSKiB       int64
	redisCommands    int64
	redisClientCalls int64
	redisReads       int64
	batches          float64
	resyncBatches    float64
	renewals         float64
	apiWrites        float64
	lockWrites       float64
}

func (a sampleValues) diff(b sampleValues) sampleValues {
	return sampleValues{
		cpuSeconds:       a.cpuSeconds - b.cpuSeconds,
		redisCommands:    a.redisCommands - b.redisCommands,
		redisClientCalls: a.redisClientCalls - b.redisClientCalls,
		redisReads:       a.redisReads - b.redisReads,
		batches:          a.batches - b.batches,
		resyncBatches:    a.resyncBatches - b.resyncBatches,
		renewals:         a.renewals - b.renewals,
		apiWrites:        a.apiWrites - b.apiWrites,
		lockWrites:       a.lockWrites - b.lockWrites,
	}
}

func sample(t *testing.T) sampleValues {
	t.Helper()
	pid := cluster.OperatorPID()
	cpu, err := processCPUSeconds(pid)
	if err != nil {
		t.Fatal(err)
	}
	rss, err := processPeakRSSKiB(pid)
	if err != nil {
		t.Fatal(err)
	}
	cmds, calls, reads := redisCounters(t)
	om := scrape(t, cluster.MetricsURL, nil)
	am := scrapeAPIServer(t)
	return sampleValues{
		cpuSeconds:       cpu,
		peakRSSKiB:       rss,
		redisCommands:    cmds,
		redisClientCalls: calls,
		redisReads:       reads,
		batches:          om.sum("lockwarden_renewal_batches_total", nil),
		resyncBatches:    om.sum("lockwarden_status_resync_batches_total", nil),
		renewals:         om.sum("lockwarden_renewals_total", map[string]string{"result": "ok"}),
		apiWrites:        am.sumWrites(""),
		lockWrites:       am.sumWrites("distributedlocks"),
	}
}

// processCPUSeconds returns user+system CPU time of pid from /proc.
func processCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may contain spaces) start after ") ".
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const clockTicks = 100 // USER_HZ on Linux
	return (utime + stime) / clockTicks, nil
}

// processPeakRSSKiB returns the peak resident set size (VmHWM) of pid.
func processPeakRSSKiB(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// redisCounters returns Redis's total commands (scripts' inner calls
// included), the commands clients sent (EVALSHA, EVAL, PING, SUBSCRIBE...:
// everything but the calls scripts make), and its reads from client sockets
// (total_reads_processed): one per round trip of a request or pipeline
// under 16 KiB, one per 16 KiB of a larger pipeline.
func redisCounters(t *testing.T) (total, client, reads int64) {
	t.Helper()
	var inner int64
	for _, addr := range cluster.RedisAddrs() {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		info, err := c.Info(context.Background(), "stats", "commandstats").Result()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
			if v, ok := strings.CutPrefix(line, "total_reads_processed:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				reads += n
			}
			// Calls made from inside scripts: the commands lockwarden's scripts
			// use (grep "redis.call" internal/lock/redis/lua).
			for _, cmd := range []string{"get", "mget", "set", "pexpire", "persist", "del", "hset", "hget", "hgetall", "hvals", "incr", "zadd", "zrem", "zrange", "zrangebyscore", "zscore", "zrank", "zcard", "zcount", "hdel", "time", "publish", "pttl", "exists", "hmget"} {
				if v, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
					n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
					inner += n
				}
			}
		}
	}
	return total, total - inner, reads
}

// saveProfile writes the operator's pprof endpoint path (profile?seconds=N,
// heap) to name beside the report.
func saveProfile(t *testing.T, path, name string) {
	t.Helper()
	resp, err := http.Get(pprofURL + "/" + path)
	if err != nil {
		t.Errorf("pprof %s: %v", path, err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("pprof %s: %s, %v", path, resp.Status, err)
		return
	}
	out := filepath.Join(cluster.Root, "bin", name)
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Error(err)
		return
	}
	t.Logf("wrote %s", out)
}

// waitHeld waits until n locks in ns report Held=True.
func waitHeld(t *testing.T, ns string, n int, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var list locksv1alpha1.DistributedLockList
		if err := cluster.Client.List(ctx, &list, inNamespace(ns)); err != nil {
			return false, nil
		}
		held := 0
		for i := range list.Items {
			if meta.IsStatusConditionTrue(list.Items[i].Status.Conditions, locksv1alpha1.ConditionHeld) {
				held++
			}
		}
		return held == n, nil
	})
	if err != nil {
		t.Fatalf("not all %d locks in %s were held within %v", n, ns, timeout)
	}
}

// parallel runs f(0..n-1) on `workers` goroutines and fails on the first error.
func parallel(t *testing.T, n, workers int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func quantiles(s []time.Duration) (p50, p99 time.Duration) {
	s = slices.Clone(s)
	slices.Sort(s)
	return s[len(s)/2], s[(len(s)*99)/100]
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		return d
	}
	return def
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		return n
	}
	return def
}

func envInts(t *testing.T, name string, def []int) []int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		out = append(out, n)
	}
	return out
}
