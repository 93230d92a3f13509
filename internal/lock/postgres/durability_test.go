package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestAcknowledgedAcquisitionSurvivesACrash: the role's commits are
// asynchronous (synchronous_commit = off, a common tuning) and the WAL writer
// flushes only every 10 s, so a commit that does not wait for its flush sits
// in shared memory, which a crash loses. A lease acknowledged right before
// the server is killed must still be there after crash recovery: another
// owner cannot take the key, and its fencing token is not issued again.
func TestAcknowledgedAcquisitionSurvivesACrash(t *testing.T) {
	s := pgtest.Start(t, pgtest.WithServerSetting("wal_writer_delay", "10s"))
	ctx := ctxFor(t, 2*time.Minute)
	if err := s.SuperuserExec(ctx, "ALTER ROLE "+pgtest.User+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	cfg := configFor(s)
	l := newTestLocker(t, cfg)
	// The schema first, made durable by a checkpoint (it flushes the WAL):
	// the crash may only take what comes after.
	if _, err := l.Inspect(ctx, []string{"crash"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SuperuserExec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	first, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"crash"}, TTL: time.Minute, Holder: "first"})
	if err != nil {
		t.Fatal(err)
	}
	s.Kill() // right after the acknowledgment
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}

	other := newTestLocker(t, cfg)
	var got *lock.Lease
	if perr := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = other.TryAcquire(ctx, lock.Request{Keys: []string{"crash"}, TTL: time.Minute, Holder: "second"})
		return !errors.Is(err, lock.ErrBackendUnavailable), nil
	}); perr != nil {
		t.Fatalf("the server did not answer after the restart: %v (last: %v)", perr, err)
	}
	if got != nil {
		t.Fatalf("after a crash right after the acknowledgment, another owner acquired the key with fencing token %d while the acknowledged lease (token %d) was still live: the acquisition was lost", got.Fence, first.Fence)
	}
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Holder != "first" || he.Fence != first.Fence {
		t.Fatalf("another owner's TryAcquire after the crash: %v; want ErrNotAcquired naming holder first with token %d", err, first.Fence)
	}
	// The first holder keeps its lease, token and all.
	var renewed *lock.Lease
	_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		renewed, err = l.Renew(ctx, first, time.Minute)
		return !errors.Is(err, lock.ErrBackendUnavailable), nil
	})
	if err != nil || renewed.Fence != first.Fence {
		t.Fatalf("Renew by the first holder after the crash: %+v, %v; want its lease with token %d", renewed, err, first.Fence)
	}
}

// TestSessionSettingsInForce: the role and the database set
// synchronous_commit and the timeouts otherwise; every pooled connection of
// the Locker has its own: synchronous_commit on, statement_timeout and
// idle_in_transaction_session_timeout the operation timeout, lock_timeout
// half of it.
func TestSessionSettingsInForce(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	for _, q := range []string{
		"ALTER DATABASE " + pgtest.Database + " SET synchronous_commit = local",
		"ALTER ROLE " + pgtest.User + " SET synchronous_commit = off",
		"ALTER ROLE " + pgtest.User + " SET statement_timeout = 0",
		"ALTER ROLE " + pgtest.User + " SET lock_timeout = '1h'",
		"ALTER ROLE " + pgtest.User + " SET idle_in_transaction_session_timeout = 0",
	} {
		if err := s.SuperuserExec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	want := map[string]string{
		"synchronous_commit":                  "on",
		"statement_timeout":                   "3s",
		"lock_timeout":                        "1500ms",
		"idle_in_transaction_session_timeout": "3s",
	}
	// The role's settings are in force on a plain connection.
	var plain string
	if err := s.Conn(t).QueryRow(ctx, "SHOW synchronous_commit").Scan(&plain); err != nil || plain != "off" {
		t.Fatalf("SHOW synchronous_commit as the role: %q, %v; want off (the role's setting)", plain, err)
	}

	const conns = 3
	l := newTestLocker(t, configFor(s), WithOperationTimeout(3*time.Second), WithMaxConns(conns))
	mustCycle(t, l, "settings")
	// All the pool's connections at once, so that each is another one.
	var held []*pgxpool.Conn
	for range conns {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for i, c := range held {
		for name, v := range want {
			var got string
			if err := c.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != v {
				t.Errorf("pooled connection %d: SHOW %s = %q, want %q", i, name, got, v)
			}
		}
	}
}

// TestExpiresMeasuredOnce: Expires is the start of the call + TTL - drift.
// The call's duration is behind that start already; subtracting it again
// would shorten every lease by a round trip.
func TestExpiresMeasuredOnce(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	l := newTestLocker(t, configFor(s))
	const ttl = 10 * time.Second
	mustCycle(t, l, "expires") // schema and statements ready
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"expires"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lease.Expires.Sub(lease.Acquired), ttl-drift(ttl); got != want {
		t.Errorf("TryAcquire: Expires - Acquired = %v, want TTL - drift = %v", got, want)
	}
	before := time.Now()
	renewed, err := l.Renew(ctx, lease, ttl)
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	// The renewal's start is between before and after.
	if lo, hi := before.Add(ttl-drift(ttl)), after.Add(ttl-drift(ttl)); renewed.Expires.Before(lo) || renewed.Expires.After(hi) {
		t.Errorf("Renew: Expires %v outside [%v, %v] (start of the call + TTL - drift)", renewed.Expires, lo, hi)
	}
}
