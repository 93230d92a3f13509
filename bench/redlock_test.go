package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// BenchmarkRedlock compares Redlock over 5 (and 3) independent redis-server
// masters with a single server (the first of the five), for lockwarden
// (Locker.TryAcquire + Release; one address: standalone, five: Redlock) and
// for redsync (TryLockContext + UnlockContext with 1 or 5 pools), on a free
// key, one goroutine. ns/op is the acquire+release cycle; ns/p50-acquire and
// ns/p99-acquire are percentiles of the acquire calls alone.
func BenchmarkRedlock(b *testing.B) {
	servers := redistest.StartN(b, 5)
	one := servers[:1]
	libs := []struct {
		name, nodes string
		lib         locklib
	}{
		{"lockwarden", "1", newLockwarden(b, "lockwarden", one, false)},
		{"lockwarden", "3", newLockwarden(b, "lockwarden", servers[:3], false)},
		{"lockwarden", "5", newLockwarden(b, "lockwarden", servers, false)},
		{"redsync", "1", newRedsync(b, "redsync", one)},
		{"redsync", "3", newRedsync(b, "redsync", servers[:3])},
		{"redsync", "5", newRedsync(b, "redsync", servers)},
	}
	for _, l := range libs {
		b.Run(fmt.Sprintf("lib=%s/nodes=%s", l.name, l.nodes), func(b *testing.B) {
			benchTimedCycle(b, l.lib, fmt.Sprintf("redlock:%s:%s", l.name, l.nodes))
		})
	}
}

// benchTimedCycle is benchCycle that also times each acquire.
func benchTimedCycle(b *testing.B, l locklib, key string) {
	ctx := context.Background()
	samples := make([]time.Duration, 0, 1024)
	cycle := func(record bool) {
		start := time.Now()
		release, err := l.try(ctx, key)
		if err != nil {
			b.Fatalf("acquire %s: %v", key, err)
		}
		if record {
			samples = append(samples, time.Since(start))
		}
		if err := release(ctx); err != nil {
			b.Fatalf("release %s: %v", key, err)
		}
	}
	cycle(false) // connect and load the scripts before the clock starts
	for b.Loop() {
		cycle(true)
	}
	reportLatency(b, "acquire", samples)
}

// BenchmarkRedlockPaired times, in each iteration, one standalone cycle and
// one Redlock-5 cycle of the same library back to back (alternating which
// goes first), so that both see the same machine load, and reports the
// medians of the acquire calls and their ratio (x/p50-5-vs-1: Redlock-5
// acquire p50 over standalone acquire p50). ns/op covers both cycles.
func BenchmarkRedlockPaired(b *testing.B) {
	servers := redistest.StartN(b, 5)
	one := servers[:1]
	libs := []struct {
		name      string
		one, five locklib
	}{
		{"lockwarden", newLockwarden(b, "lockwarden", one, false), newLockwarden(b, "lockwarden", servers, false)},
		{"redsync", newRedsync(b, "redsync", one), newRedsync(b, "redsync", servers)},
	}
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) {
			ctx := context.Background()
			var t1, t5 []time.Duration
			cycle := func(lib locklib, key string, into *[]time.Duration) {
				start := time.Now()
				release, err := lib.try(ctx, key)
				if err != nil {
					b.Fatalf("acquire %s: %v", key, err)
				}
				if into != nil {
					*into = append(*into, time.Since(start))
				}
				if err := release(ctx); err != nil {
					b.Fatalf("release %s: %v", key, err)
				}
			}
			k1, k5 := "redlockpaired:"+l.name+":1", "redlockpaired:"+l.name+":5"
			cycle(l.one, k1, nil)
			cycle(l.five, k5, nil)
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					cycle(l.one, k1, &t1)
					cycle(l.five, k5, &t5)
				} else {
					cycle(l.five, k5, &t5)
					cycle(l.one, k1, &t1)
				}
				i++
			}
			p1, p5 := percentile(t1, 0.5), percentile(t5, 0.5)
			b.ReportMetric(float64(p1.Nanoseconds()), "ns/p50-acquire-1node")
			b.ReportMetric(float64(p5.Nanoseconds()), "ns/p50-acquire-5nodes")
			b.ReportMetric(float64(p5)/float64(p1), "x/p50-5-vs-1")
		})
	}
}
