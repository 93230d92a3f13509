package etcd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// The benchmarks run against one local member; compare BenchmarkCycle with
// BenchmarkFloor (the raw etcd calls any correct lease needs) for the
// engine's overhead:
//
//	go test ./internal/lock/etcd -run '^$' -bench . -benchtime=200x

// BenchmarkCycle is an uncontended TryAcquire + Release of one key: a Txn,
// then a Txn (the session's keepalive, once per half TTL, is shared by every
// acquisition).
func BenchmarkCycle(b *testing.B) {
	m := etcdtest.Start(b)
	l := newTestLocker(b, Config{Endpoints: []string{m.Addr}, Prefix: "/bench/"})
	ctx := context.Background()
	req := lock.Request{Keys: []string{"cycle"}, TTL: 10 * time.Second, Holder: "bench"}
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

// BenchmarkFloor is what a lease of its own needs with the raw client: a
// lease with a TTL (Grant), a put-if-absent with it (Txn), a delete (Txn) and
// the end of the lease (Revoke). With a session shared by many leases, as
// the Locker's, the floor is the two Txns.
func BenchmarkFloor(b *testing.B) {
	m := etcdtest.Start(b)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	ctx := context.Background()
	const key = "/bench-floor/k"
	for b.Loop() {
		g, err := cli.Grant(ctx, 10)
		if err != nil {
			b.Fatal(err)
		}
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, "owner", clientv3.WithLease(g.ID))).Commit()
		if err != nil || !r.Succeeded {
			b.Fatalf("put: %v %v", r, err)
		}
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", "owner")).Then(clientv3.OpDelete(key)).Commit(); err != nil {
			b.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, g.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandover: a holder releases the key while a waiter is blocked in
// Acquire (queued, from another Locker, its watch set up); it reports the
// time from the Release call to the waiter's Acquire returning. (A release
// that races the waiter's watch creation is seen by the watch too, since it
// starts at the revision the attempt read, but etcd delivers events to a
// watch that starts in the past from its catch-up loop, every 100ms.) The waiter's fallback
// polling is set to 5s and its queue heartbeat to 10s, so a handover in
// milliseconds can only come from the watch event.
func BenchmarkHandover(b *testing.B) {
	m := etcdtest.Start(b)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/bench/"}
	holder := newTestLocker(b, cfg)
	// The waiter logs "Waiting for lease" once its watch is set up.
	waiting := make(chan struct{}, 1)
	sink := funcr.New(func(_, args string) {
		if strings.Contains(args, "Waiting for lease") {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{Verbosity: 4})
	waiter := newTestLocker(b, cfg, WithBackoff(wait.Backoff{Duration: 5 * time.Second, Factor: 1}), WithWaiterTTL(30*time.Second), WithLogger(sink))
	ctx := context.Background()
	var lat []time.Duration
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("handover-%d", i)
		i++
		h, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		type res struct {
			lease *lock.Lease
			at    time.Time
			err   error
		}
		select { // a signal left from the previous round
		case <-waiting:
		default:
		}
		done := make(chan res, 1)
		go func() {
			lease, err := waiter.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second, Queue: true, Holder: "waiter"})
			done <- res{lease, time.Now(), err}
		}()
		// Wait until the waiter is blocked: its first attempt failed
		// and its watch is set up.
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

// BenchmarkRenewAll is one watchdog round over held leases (see
// locktest.BenchRenewAll): each renewal is a Txn (the owner check) and a
// KeepAliveOnce of the lease's own etcd lease.
func BenchmarkRenewAll(b *testing.B) {
	m := etcdtest.Start(b)
	l := newTestLocker(b, Config{Endpoints: []string{m.Addr}, Prefix: "/bench/"})
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), "renew")
}
