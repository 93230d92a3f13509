package postgres

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// BenchmarkCycle: one uncontended TryAcquire and Release of one key (two
// round trips, two transactions, one NOTIFY).
func BenchmarkCycle(b *testing.B) {
	s := pgtest.Start(b)
	l := newTestLocker(b, configFor(s))
	ctx := context.Background()
	req := lock.Request{Keys: []string{"bench/cycle"}, TTL: 10 * time.Second, Holder: "bench"}
	mustCycleB(b, l, req) // connect and migrate outside the loop
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

func mustCycleB(b *testing.B, l *Locker, req lock.Request) {
	b.Helper()
	lease, err := l.TryAcquire(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Release(context.Background(), lease); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFloor: the least a correct lease needs on PostgreSQL, with a raw
// pgx connection: one statement that takes a free or expired key with a
// compare-and-set, bumps its fence and sets the expiry by the database clock,
// and one that releases it by owner and notifies waiters. No queue, no
// multi-key ordering, no function call: what BenchmarkCycle pays on top is
// the price of those.
func BenchmarkFloor(b *testing.B) {
	s := pgtest.Start(b)
	c := s.Conn(b)
	ctx := context.Background()
	if _, err := c.Exec(ctx, `CREATE SCHEMA floor; CREATE TABLE floor.leases (
		key bytea PRIMARY KEY, owner text, fence bigint NOT NULL, expires timestamptz)`); err != nil {
		b.Fatal(err)
	}
	const acquire = `INSERT INTO floor.leases AS l (key, owner, fence, expires)
		VALUES ($1, $2, 1, clock_timestamp() + $3 * interval '1 millisecond')
		ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, expires = EXCLUDED.expires
		WHERE l.owner IS NULL OR l.expires <= clock_timestamp()
		RETURNING l.fence`
	const release = `WITH r AS (UPDATE floor.leases l SET owner = NULL
		WHERE l.key = $1 AND l.owner = $2 AND l.expires > clock_timestamp() RETURNING l.key)
		SELECT count(pg_notify('floor_released', encode(r.key, 'hex'))) FROM r`
	key, owner := []byte("bench/floor"), "owner-token"
	for b.Loop() {
		var fence int64
		if err := c.QueryRow(ctx, acquire, key, owner, int64(10000)).Scan(&fence); err != nil {
			b.Fatal(err)
		}
		var n int64
		if err := c.QueryRow(ctx, release, key, owner).Scan(&n); err != nil || n != 1 {
			b.Fatalf("release: %d, %v", n, err)
		}
	}
}

// BenchmarkHandover: a holder releases while a waiter is blocked in Acquire
// (queued, so Inspect shows it waiting); the time from the release to the
// waiter holding the key is reported as p50 and p99. The holder keeps the key
// for 50ms first, so the waiter's fallback polling has backed off: a
// handover of a few milliseconds comes from the NOTIFY, not from polling.
func BenchmarkHandover(b *testing.B) {
	s := pgtest.Start(b)
	cfg := configFor(s)
	holder, waiter := newTestLocker(b, cfg), newTestLocker(b, cfg)
	ctx := context.Background()
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		key := fmt.Sprintf("bench/handover/%d", i)
		h, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			lease, err := waiter.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Queue: true, Holder: "waiter"})
			now := time.Now()
			if err != nil {
				b.Error(err)
				close(got)
				return
			}
			got <- now
			_ = waiter.Release(ctx, lease)
		}()
		err = wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			st, err := holder.Inspect(ctx, []string{key})
			return err == nil && len(st[0].Waiters) == 1, nil
		})
		if err != nil {
			b.Fatal("the waiter never queued")
		}
		time.Sleep(50 * time.Millisecond) // let the waiter's polling back off; not a synchronization
		start := time.Now()
		if err := holder.Release(ctx, h); err != nil {
			b.Fatal(err)
		}
		at, ok := <-got
		if !ok {
			b.FailNow()
		}
		lat = append(lat, at.Sub(start))
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkRenewAll is one watchdog round over held leases (see
// locktest.BenchRenewAll): one UPDATE statement per 100 leases' rows.
func BenchmarkRenewAll(b *testing.B) {
	s := pgtest.Start(b)
	l := newTestLocker(b, configFor(s))
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), "renew")
}
