package watchdog_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// BenchmarkRenewalRound: the watchdog renewing every lease it holds through
// the Redis engine, on one redis-server and on 3 Redlock masters. One
// iteration is one round: the (fake) clock moves a third of the TTL, every
// lease is due, one RenewDue renews them all. Reported: renewals/s (what the
// watchdog can sustain: leases/TTL*3 are due per second), CPU time of this
// process per renewal, allocations per renewal.
func BenchmarkRenewalRound(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, n := range []int{20000, 50000} {
			b.Run(fmt.Sprintf("nodes=%d/leases=%d", nodes, n), func(b *testing.B) { benchRenewalRound(b, nodes, n) })
		}
	}
}

func benchRenewalRound(b *testing.B, nodes, n int) {
	const ttl = 30 * time.Second
	servers := redistest.StartN(b, nodes)
	clk := clocktesting.NewFakeClock(time.Now())
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr)
	}
	l, err := redis.New(redis.Config{Addrs: addrs}, redis.WithClock(clk), redis.WithNodeTimeout(benchNodeTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	w := watchdog.New(func(l watchdog.Lost) { b.Errorf("lost %v: %v", l.Ref, l.Err) }, watchdog.WithClock(clk))

	// The leases are written straight into Redis (acquiring 50,000 leases
	// one by one would dominate the benchmark): what renew.lua checks is the
	// owner token in the lock key.
	leases := make([]*lock.Lease, n)
	for i := range leases {
		key := fmt.Sprintf("bench/renew/%06d", i)
		leases[i] = &lock.Lease{Keys: []string{key}, Owner: fmt.Sprintf("owner-%06d", i), Holder: "bench", Fence: int64(i + 1), TTL: ttl, Acquired: clk.Now(), Expires: clk.Now().Add(ttl)}
	}
	ctx := context.Background()
	for _, s := range servers {
		c := s.Client()
		for chunk := range 50 {
			pipe := c.Pipeline()
			for i := chunk; i < n; i += 50 {
				le := leases[i]
				pipe.Set(ctx, "{"+le.Keys[0]+"}:lock", redistest.LeaseValue(le.Owner, le.Fence, 0, le.Holder), time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i, le := range leases {
		w.Hold(holder.Ref{Kind: "Job", Namespace: "bench", Name: fmt.Sprintf("job-%06d", i)}, l, le)
	}

	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	retries := 0
	for range b.N {
		clk.Step(ttl / 3)
		w.RenewDue(ctx)
		// What failed (a pipeline past the node timeout on a loaded
		// machine) is due still: retried on the next ticks, as Start does.
		for try := 0; try < 20 && notRenewed(w, n, clk.Now().Add(ttl/2)) > 0; try++ {
			retries++
			w.RenewDue(ctx)
		}
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	// Every lease was renewed in the last round (the Locker's clock is the
	// fake one: no time passes during a renewal).
	if stale := notRenewed(w, n, clk.Now().Add(ttl/2)); stale > 0 {
		b.Fatalf("%d of %d leases not renewed in the last round", stale, n)
	}
	renewals := float64(n * b.N)
	b.ReportMetric(renewals/elapsed.Seconds(), "renewals/s")
	b.ReportMetric(float64(cpu.Microseconds())/renewals, "cpu-us/renewal")
	b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/round")
	b.ReportMetric(float64(retries)/float64(b.N), "retries/round")
}

// notRenewed counts the leases of benchRenewalRound that expire before by.
func notRenewed(w *watchdog.Watchdog, n int, by time.Time) int {
	stale := 0
	for i := range n {
		le, _, ok := w.Holding(holder.Ref{Kind: "Job", Namespace: "bench", Name: fmt.Sprintf("job-%06d", i)})
		if !ok || le.Expires.Before(by) {
			stale++
		}
	}
	return stale
}

var benchNodeTimeout = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv("BENCH_NODE_TIMEOUT"))
	if err != nil {
		return redis.DefaultNodeTimeout
	}
	return d
}()

// BenchmarkTickWithNothingDue: one look of the watchdog (a tick, four a
// second by default) while 50,000 leases are held and none is due, as
// between two rounds of a steady state.
func BenchmarkTickWithNothingDue(b *testing.B) {
	const n = 50000
	clk := clocktesting.NewFakeClock(t0)
	w := watchdog.New(nil, watchdog.WithClock(clk))
	backend := newFakeLocker(clk)
	for i := range n {
		key := fmt.Sprintf("idle-%06d", i)
		w.Hold(job(key), backend, leaseOn(key, ttl))
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		w.RenewDue(ctx)
	}
	if calls := backend.Calls(); len(calls) != 0 {
		b.Fatalf("%d RenewAll calls with nothing due", len(calls))
	}
}
