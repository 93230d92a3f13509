package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/faketime"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestServerClockJumps shows what a jump of the database server's wall clock
// does to leases, whose ends are that clock's clock_timestamp() + TTL
// (libfaketime preloaded into the server, the offset changed while it
// runs; docs/safety.md, "Clock jumps"):
//
//   - forward past a lease's end: the next acquirer finds the lease expired
//     and takes the key while the first holder's Expires, by the client's
//     clock, is still ahead: two valid leases. The test fails if it does
//     not happen: the documented requirement (no stepping of the database
//     server's clock) would then guard against nothing, or something in
//     the engine would have changed what a jump does.
//   - backward: the leases granted before last longer on the server than
//     their Expires: a key stays held past its holder's Expires (never two
//     holders).
func TestServerClockJumps(t *testing.T) {
	faketime.Require(t)
	s := pgtest.Start(t, pgtest.WithClockControl())
	cfg := configFor(s)
	first, second, third := newTestLocker(t, cfg), newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxFor(t, time.Minute)

	const ttl = 20 * time.Second
	held, err := first.TryAcquire(ctx, lock.Request{Keys: []string{"jump"}, TTL: ttl, Holder: "first"})
	if err != nil {
		t.Fatal(err)
	}
	const jump = 30 * time.Second
	if err := s.SetClockOffset(jump); err != nil {
		t.Fatal(err)
	}
	took, err := second.TryAcquire(ctx, lock.Request{Keys: []string{"jump"}, TTL: 2 * time.Second, Holder: "second"})
	left := time.Until(held.Expires)
	switch {
	case err != nil:
		t.Fatalf("after the server's clock jumped %v forward, past the lease's end, another owner was refused (%v): the control shows nothing", jump, err)
	case left <= 0:
		t.Fatalf("the first lease's Expires passed before the second owner acquired: the test shows nothing")
	}
	t.Logf("forward jump of %v: a second owner took the key (fence %d) %v before the first lease (fence %d) expired",
		jump, took.Fence, left.Round(time.Millisecond), held.Fence)

	// Back by the same amount: the second lease, granted at the jumped
	// clock, now ends jump later on the server than its Expires.
	if err := s.SetClockOffset(0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(took.Expires.Add(100 * time.Millisecond)))
	_, err = third.TryAcquire(ctx, lock.Request{Keys: []string{"jump"}, TTL: time.Second, Holder: "third"})
	var he *lock.HeldError
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.As(err, &he) || he.Fence != took.Fence {
		t.Fatalf("after a backward jump of %v, past the second lease's Expires: TryAcquire = %v, want refused by the second lease (fence %d), which the server holds longer", jump, err, took.Fence)
	}
	if err := second.Release(context.Background(), took); err != nil {
		t.Fatalf("release the second lease: %v", err)
	}
}
