package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestForeignRowLockDoesNotWedgeOtherKeys: a session outside the Locker (a
// client paused inside a transaction, an administrator's session) holds the
// row of key b FOR UPDATE and idles. A call on a and b locks a's row, in key
// order, and waits for b's; then its client is cut off from the server (a
// partition: no new connection gets through). It gives up at the operation
// timeout and closes its connection, which the waiting backend does not
// notice, and the cancel request pgx sends on a new connection never
// arrives: only a server-side bound stops the backend, and until then it
// holds a's row. Another client's call on a alone must then succeed before a
// deadline of a few operation timeouts, long before the foreign transaction
// ends, rather than stay wedged with it.
func TestForeignRowLockDoesNotWedgeOtherKeys(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	// cutCfg dials like cfg until cut is set, then reaches nothing. A call
	// in flight on a pooled connection still reaches the server.
	var cut atomic.Bool
	cutCfg := cfg
	cutCfg.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		if cut.Load() {
			return nil, fmt.Errorf("dial %s: partitioned from the server", address)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	const opTimeout = time.Second
	// The bound for the call on a: many times the server-side lock_timeout
	// (half the operation timeout), and the foreign transaction idles for
	// the rest of the test.
	const bound = 10 * opTimeout

	// lockRow opens a transaction on a plain connection that holds key's row
	// FOR UPDATE until the test ends, and checks at the end that it was
	// still open: the keys were freed by the server's bound, not by it.
	lockRow := func(t *testing.T, ctx context.Context, key string) {
		t.Helper()
		tx, err := s.Conn(t).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM lockwarden.locks WHERE key = $1 FOR UPDATE) r", []byte(key)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("lock the row of %s: %d rows, %v", key, n, err)
		}
		t.Cleanup(func() {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Errorf("the foreign transaction ended before the test did: %v", err)
			}
			_ = tx.Rollback(ctx)
		})
	}
	// serverBounded reports (without stopping the test) whether err came
	// from the server's lock_timeout rather than the client's deadline.
	serverBounded := func(t *testing.T, what string, err error) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			t.Errorf("%s failed with %v; want the server's lock_timeout (55P03 lock_not_available), which stops the backend, not just the client", what, err)
		}
	}

	t.Run("Acquire", func(t *testing.T) {
		ctx := ctxFor(t, time.Minute)
		cut.Store(false)
		l := newTestLocker(t, cutCfg, WithOperationTimeout(opTimeout), WithMaxConns(1))
		mustCycle(t, l, "acq-a")
		mustCycle(t, l, "acq-b") // the rows exist, and l has a pooled connection
		lockRow(t, ctx, "acq-b")

		cut.Store(true) // the call goes out on the pooled connection; nothing else will
		_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"acq-a", "acq-b"}, TTL: 10 * time.Second})
		if !errors.Is(err, lock.ErrBackendUnavailable) {
			t.Fatalf("TryAcquire of acq-a and acq-b while acq-b's row is locked: %v; want ErrBackendUnavailable", err)
		}
		serverBounded(t, "TryAcquire of acq-a and acq-b", err)

		other := newTestLocker(t, cfg, WithOperationTimeout(opTimeout))
		lease, err := untilDone(ctx, bound, func(ctx context.Context) (*lock.Lease, error) {
			return other.TryAcquire(ctx, lock.Request{Keys: []string{"acq-a"}, TTL: 10 * time.Second})
		})
		if err != nil {
			t.Fatalf("another owner's TryAcquire of the free key acq-a did not succeed within %v: %v (the abandoned acquisition's backend still holds its row)", bound, err)
		}
		if err := other.Release(ctx, lease); err != nil {
			t.Fatal(err)
		}
	})

	// A renewal batch whose last key is locked by the foreign session: the
	// batch's backend holds the rows of the other keys while it waits.
	t.Run("Renew", func(t *testing.T) {
		ctx := ctxFor(t, time.Minute)
		cut.Store(false)
		l := newTestLocker(t, cutCfg, WithOperationTimeout(opTimeout), WithMaxConns(1))
		var leases []*lock.Lease
		for _, k := range []string{"ren-a", "ren-b", "ren-c"} {
			le, err := l.TryAcquire(ctx, lock.Request{Keys: []string{k}, TTL: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, le)
		}
		lockRow(t, ctx, "ren-c")

		cut.Store(true)
		_, errs := l.RenewAll(ctx, leases, 30*time.Second)
		for i, err := range errs {
			if !errors.Is(err, lock.ErrBackendUnavailable) {
				t.Fatalf("RenewAll[%d] while ren-c's row is locked: %v; want ErrBackendUnavailable (the leases are kept until they expire)", i, err)
			}
		}
		serverBounded(t, "RenewAll", errs[0])

		// Another replica of the holder releases ren-a (the lease's keys and
		// owner are all it needs): it must not wait for the foreign session.
		other := newTestLocker(t, cfg, WithOperationTimeout(opTimeout))
		_, err := untilDone(ctx, bound, func(ctx context.Context) (*lock.Lease, error) {
			return nil, other.Release(ctx, leases[0])
		})
		if err != nil {
			t.Fatalf("Release of ren-a did not succeed within %v: %v (the abandoned renewal's backend still holds its row)", bound, err)
		}
	})
}

// untilDone calls f until it succeeds or fails with something other than
// ErrBackendUnavailable, or bound passes; it returns f's last result.
func untilDone(ctx context.Context, bound time.Duration, f func(ctx context.Context) (*lock.Lease, error)) (*lock.Lease, error) {
	bctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		lease, err := f(bctx)
		if !errors.Is(err, lock.ErrBackendUnavailable) || bctx.Err() != nil {
			return lease, err
		}
	}
}
