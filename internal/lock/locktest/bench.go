package locktest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// BenchLeases is how many leases BenchRenewAll holds: the environment's
// LOCKWARDEN_BENCH_LEASES, or 1000 (docs/benchmarks.md measures 20,000).
func BenchLeases(b *testing.B) int {
	n := 1000
	if v := os.Getenv("LOCKWARDEN_BENCH_LEASES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("LOCKWARDEN_BENCH_LEASES=%q: want a positive number of leases", v)
		}
	}
	return n
}

// BenchRenewAll measures one renewal round of n held leases, as the
// operator's watchdog makes it every renewal period: one RenewAll of every
// lease (one key each). It reports the time per lease (ns/lease), which at
// the watchdog's pace (every lease renewed once per third of its TTL) is
// the store's share of the operator's CPU, and the round's wall time.
// What one renewal writes in the store is the store's own (its package
// documentation, docs/benchmarks.md).
func BenchRenewAll(b *testing.B, l lock.Locker, n int, prefix string) {
	ctx := context.Background()
	const ttl = 5 * time.Minute
	leases := make([]*lock.Lease, n)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{fmt.Sprintf("%s/%d", prefix, i)}, TTL: ttl, Holder: "bench"})
				if err != nil {
					select {
					case errs <- fmt.Errorf("acquire lease %d of %d: %w", i, n, err):
					default:
					}
					return
				}
				leases[i] = lease
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < n; i += 16 {
					_ = l.Release(context.Background(), leases[i])
				}
			})
		}
		wg.Wait()
	})
	b.ResetTimer()
	for b.Loop() {
		renewed, rerrs := l.RenewAll(ctx, leases, ttl)
		for i, err := range rerrs {
			if err != nil {
				b.Fatalf("renew lease %d of %d: %v", i, n, err)
			}
			leases[i] = renewed[i]
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/lease")
	b.ReportMetric(float64(n), "leases")
}
