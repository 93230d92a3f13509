package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestSameOwnerReacquireIssuesLargerFence: an owner acquiring keys it
// already holds (a restarted operator) gets a new, larger fencing token;
// Inspect reports it; the first lease (the old token) can no longer be
// renewed (with the same or another TTL) or released, and neither attempt
// touches the new acquisition.
func TestSameOwnerReacquireIssuesLargerFence(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/reacquire/"}
	ctx := ctxT(t, time.Minute)
	keys := []string{"ns/a/job", "ns/a/db"}
	owner := ownerToken(t)
	req := lock.Request{Keys: keys, TTL: 10 * time.Second, Owner: owner, Holder: "operator"}

	first, err := newTestLocker(t, cfg).TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, cfg)
	second, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire by the holding owner: %v", err)
	}
	if second.Fence <= first.Fence || second.Fence >= lock.MaxFence {
		t.Fatalf("the same owner acquiring again got fence %d, want > %d (the first acquisition's) and < MaxFence", second.Fence, first.Fence)
	}

	wantHeld := func(when string) {
		t.Helper()
		st, err := l.Inspect(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if !s.Held || s.Fence != second.Fence || len(s.Holders) != 1 || s.Holders[0].Fence != second.Fence {
				t.Fatalf("%s: Inspect = %+v, want held with the new fence %d", when, s, second.Fence)
			}
		}
	}
	wantHeld("after acquiring again")

	if _, err := l.Renew(ctx, stored(first), 10*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the first lease (old fence %d) = %v, want ErrLost", first.Fence, err)
	}
	if _, err := l.Renew(ctx, stored(first), 3*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew with another TTL of the first lease (old fence %d) = %v, want ErrLost", first.Fence, err)
	}
	if err := l.Release(ctx, stored(first)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the first lease (old fence %d) = %v, want ErrNotHeld", first.Fence, err)
	}
	wantHeld("after renewing and releasing the first lease")

	// The new lease works: renewals (also with another TTL) keep its token.
	renewed, err := l.Renew(ctx, stored(second), 10*time.Second)
	if err != nil || renewed.Fence != second.Fence {
		t.Fatalf("Renew of the second lease = %+v, %v; want fence %d", renewed, err, second.Fence)
	}
	renewed, err = l.Renew(ctx, stored(second), 3*time.Second)
	if err != nil || renewed.Fence != second.Fence {
		t.Fatalf("Renew with another TTL of the second lease = %+v, %v; want fence %d", renewed, err, second.Fence)
	}
	wantHeld("after renewing the second lease")

	// Acquiring once more issues yet another, larger token.
	third, err := l.TryAcquire(ctx, req)
	if err != nil || third.Fence <= second.Fence {
		t.Fatalf("third TryAcquire by the holding owner = %+v, %v; want a fence > %d", third, err, second.Fence)
	}
	if err := l.Release(ctx, stored(second)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the second lease after a third acquisition = %v, want ErrNotHeld", err)
	}
	if err := l.Release(ctx, stored(third)); err != nil {
		t.Fatalf("Release of the third lease: %v", err)
	}
	st, err := l.Inspect(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Held || s.Fence != third.Fence {
			t.Fatalf("after Release Inspect = %+v, want free with the last fence %d", s, third.Fence)
		}
	}
	// A free key's next acquisition is larger still.
	next, err := l.TryAcquire(ctx, lock.Request{Keys: keys[:1], TTL: time.Second, Owner: owner})
	if err != nil || next.Fence <= third.Fence {
		t.Fatalf("TryAcquire after Release = %+v, %v; want a fence > %d", next, err, third.Fence)
	}
	if err := l.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
}
