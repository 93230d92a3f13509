package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// The benchmarks run against the package's envtest kube-apiserver:
//
//	go test ./internal/lock/kubernetes -run '^$' -bench 'Cycle|Handover' -benchtime=200x

// benchLocker returns a Locker whose client is not rate-limited (client-go's
// default of 5 requests a second would be what is measured).
func benchLocker(b *testing.B, prefix string, opts ...Option) *Locker {
	if env == nil {
		b.Skip("needs kube-apiserver and etcd")
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	return newTestLocker(b, Config{Client: clientFor(b, cfg), Prefix: prefix}, opts...)
}

// BenchmarkCycle is an uncontended TryAcquire + Release of one key: a read
// and a write of the key's Lease each (the session is written once, then
// only every half TTL).
func BenchmarkCycle(b *testing.B) {
	l := benchLocker(b, "bench-cycle")
	ctx := context.Background()
	req := lock.Request{Keys: []string{"cycle"}, TTL: time.Minute, Holder: "bench"}
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

// BenchmarkHandover: a holder releases the key while a waiter is blocked in
// Acquire (queued, from another Locker, its watch of the key's Lease set
// up); it reports the time from the Release call to the waiter's Acquire
// returning. The waiter's fallback polling is 5s and its queue heartbeat
// 10s, so a handover in milliseconds comes from the watch event.
func BenchmarkHandover(b *testing.B) {
	holder := benchLocker(b, "bench-handover")
	waiting := make(chan struct{}, 1)
	sink := funcr.New(func(_, args string) {
		if strings.Contains(args, "Waiting for lease") {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{Verbosity: 4})
	waiter := benchLocker(b, "bench-handover", WithBackoff(wait.Backoff{Duration: 5 * time.Second, Factor: 1}), WithWaiterTTL(30*time.Second), WithLogger(sink))
	ctx := context.Background()
	var lat []time.Duration
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("handover-%d", i)
		i++
		h, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		type res struct {
			lease *lock.Lease
			at    time.Time
			err   error
		}
		select {
		case <-waiting:
		default:
		}
		done := make(chan res, 1)
		go func() {
			lease, err := waiter.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Queue: true, Holder: "waiter"})
			done <- res{lease, time.Now(), err}
		}()
		select {
		case <-waiting:
		case r := <-done:
			b.Fatalf("Acquire returned while the key was held: %v", r.err)
		}
		start := time.Now()
		if err := holder.Release(ctx, h); err != nil {
			b.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			b.Fatal(r.err)
		}
		lat = append(lat, r.at.Sub(start))
		if err := waiter.Release(ctx, r.lease); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkRenewAll measures one renewal round of held leases
// (LOCKWARDEN_BENCH_LEASES, default 1000): one list of the keys and one
// session write.
func BenchmarkRenewAll(b *testing.B) {
	l := benchLocker(b, "bench")
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), b.Name())
}
