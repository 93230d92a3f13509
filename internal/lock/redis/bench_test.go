package redis

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The engine's own benchmarks, on one standalone redis-server: the mutex
// (Limit 1) beside the semaphore (Limit 3). The cross-library comparison of
// the mutex lives in bench/ (docs/benchmarks.md).

// BenchmarkMutexCycle: one uncontended TryAcquire and Release of one key
// (two scripts, two round trips).
func BenchmarkMutexCycle(b *testing.B) { benchCycle(b, 1, 0) }

// BenchmarkSemaphoreCycle: the same with Limit 3, on a free key
// (others=0) and on a key two other leases hold (others=2: the last slot).
func BenchmarkSemaphoreCycle(b *testing.B) {
	for _, others := range []int{0, 2} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) { benchCycle(b, 3, others) })
	}
}

func benchCycle(b *testing.B, limit, others int) {
	s := redistest.Start(b)
	l := newTestLocker(b, Config{Addrs: []string{s.Addr}})
	ctx := context.Background()
	req := lock.Request{Keys: []string{"bench/cycle"}, TTL: 10 * time.Second, Holder: "bench", Limit: limit}
	for range others {
		if _, err := l.TryAcquire(ctx, lock.Request{Keys: req.Keys, TTL: time.Hour, Holder: "other", Limit: limit}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		lease, err := l.TryAcquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, lease); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMutexHandover: a holder releases while a waiter is blocked in
// Acquire (queued, so Inspect shows it waiting); the time from the Release
// call to the waiter holding the key is reported as p50 and p99.
func BenchmarkMutexHandover(b *testing.B) { benchHandover(b, 1) }

// BenchmarkSemaphoreHandover: the same with Limit 3: three holders fill the
// slots, a waiter blocks, one holder releases.
func BenchmarkSemaphoreHandover(b *testing.B) { benchHandover(b, 3) }

// handoverHold is how long the holder keeps the key once the waiter is
// queued: the waiter's fallback polling has backed off by then, so a handover
// of well under a millisecond comes from the release message.
const handoverHold = 20 * time.Millisecond

func benchHandover(b *testing.B, limit int) {
	s := redistest.Start(b)
	cfg := Config{Addrs: []string{s.Addr}}
	holder, waiter := newTestLocker(b, cfg), newTestLocker(b, cfg)
	ctx := context.Background()
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		key := fmt.Sprintf("bench/handover/%d", i)
		var held []*lock.Lease
		for range limit {
			h, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Limit: limit})
			if err != nil {
				b.Fatal(err)
			}
			held = append(held, h)
		}
		got := make(chan time.Time, 1)
		go func() {
			lease, err := waiter.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Queue: true, Holder: "waiter", Limit: limit})
			now := time.Now()
			if err != nil {
				b.Error(err)
				close(got)
				return
			}
			got <- now
			_ = waiter.Release(ctx, lease)
		}()
		for {
			st, err := holder.Inspect(ctx, []string{key})
			if err == nil && st[0].Queued == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(handoverHold) // let the waiter's polling back off; not a synchronization
		start := time.Now()
		if err := holder.Release(ctx, held[0]); err != nil {
			b.Fatal(err)
		}
		at, ok := <-got
		if !ok {
			b.FailNow()
		}
		lat = append(lat, at.Sub(start))
		for _, h := range held[1:] {
			if err := holder.Release(ctx, h); err != nil {
				b.Fatal(err)
			}
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkRenewAll is one watchdog round over held leases (see
// locktest.BenchRenewAll): one renew script call per lease, pipelined.
func BenchmarkRenewAll(b *testing.B) {
	s := redistest.Start(b)
	l := newTestLocker(b, Config{Addrs: []string{s.Addr}})
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), "renew")
}
