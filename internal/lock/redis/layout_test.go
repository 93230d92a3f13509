package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// A lease is one key: its value carries the owner, the fencing token, when
// it was taken and by whom, so that taking, renewing and releasing it each
// touch the lock key alone (and the fence counter, when taking it).
func TestLeaseIsOneKey(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)

	// A holder and an owner token with the layout's separators in them.
	owner := "12:owner with spaces 7 8 "
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "batch job 1", Owner: owner})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	v, err := c.Get(ctx, "{m}:lock").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := redistest.LeaseOwner(v); got != owner {
		t.Fatalf("lock key = %q: owner %q; want %q", v, got, owner)
	}
	if want := fmt.Sprintf("%d:%s %d ", len(owner), owner, lease.Fence); !strings.HasPrefix(v, want) || !strings.HasSuffix(v, " batch job 1") {
		t.Fatalf("lock key = %q; want <owner length>:<owner> <fence> <acquired> <holder>, starting %q", v, want)
	}
	states, err := l.Inspect(ctx, []string{"m"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; !st.Held || st.Holder != "batch job 1" || st.Fence != lease.Fence || st.Acquired.IsZero() {
		t.Fatalf("Inspect = held %v, holder %q, fence %d, acquired %v; want %q, %d, a time", st.Held, st.Holder, st.Fence, st.Acquired, "batch job 1", lease.Fence)
	}

	// Another owner whose token is a prefix of the value is refused, and
	// told who holds the key.
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{"m"}, TTL: time.Minute, Holder: "intruder", Owner: "12:owner with"})
	var held *lock.HeldError
	if !errors.As(err, &held) || held.Holder != "batch job 1" || held.Fence != lease.Fence {
		t.Fatalf("TryAcquire by another owner = %v; want a HeldError naming %q with fence %d", err, "batch job 1", lease.Fence)
	}
	impostor := *lease
	impostor.Owner = "12:owner with spaces"
	if _, err := l.Renew(ctx, &impostor, time.Minute); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew by another owner = %v; want ErrLost", err)
	}
	if got, _ := c.Get(ctx, "{m}:lock").Result(); got != v {
		t.Fatalf("after the impostor's renewal the lock key = %q; want it unchanged (%q)", got, v)
	}

	if err := c.PExpire(ctx, "{m}:lock", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Renew(ctx, lease, time.Minute); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if pttl, err := c.PTTL(ctx, "{m}:lock").Result(); err != nil || pttl <= 50*time.Second {
		t.Fatalf("PTTL after Renew = %v, %v; want about a minute", pttl, err)
	}
	released, err := l.Watch(ctx, "m")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expectRelease(t, released, "m")
	if n, err := c.Exists(ctx, "{m}:lock").Result(); err != nil || n != 0 {
		t.Fatalf("after the release EXISTS lock = %d, %v; want 0", n, err)
	}
}

// A lock key whose value is not a lease (the bare owner token that leases
// were before the one-key layout, or anything another client wrote there) is
// held by nobody the engine can name: every acquisition is refused, the token
// in it renews and releases nothing, and the key is free once it expires.
func TestLockKeyThatIsNotALeaseIsBusy(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	const owner = "0123456789abcdef0123456789abcdef"
	if err := c.Set(ctx, "{o}:lock", owner, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, req := range []lock.Request{
		{Keys: []string{"o"}, TTL: time.Minute, Holder: "new"},
		{Keys: []string{"o"}, TTL: time.Minute, Holder: "its token", Owner: owner},
	} {
		_, err := l.TryAcquire(ctx, req)
		var held *lock.HeldError
		if !errors.As(err, &held) || held.Holder != "" || held.Fence != 0 {
			t.Fatalf("TryAcquire by %q of a key that is not a lease = %v; want a HeldError with no holder and token 0", req.Holder, err)
		}
	}
	states, err := l.Inspect(ctx, []string{"o"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; !st.Held || st.Holder != "" || st.Fence != 0 {
		t.Fatalf("Inspect = held %v, holder %q, fence %d; want held, by nobody named, token 0", st.Held, st.Holder, st.Fence)
	}
	lease := &lock.Lease{Keys: []string{"o"}, Owner: owner, TTL: time.Minute, Fence: 1}
	if _, err := l.Renew(ctx, lease, time.Minute); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew with the token in the key = %v; want ErrLost", err)
	}
	// The lost renewal released nothing it did not hold: the value is as it was.
	if v, err := c.Get(ctx, "{o}:lock").Result(); err != nil || v != owner {
		t.Fatalf("lock key after the renewal = %q, %v; want it unchanged", v, err)
	}
	if n, err := l.raiseOn(ctx, l.nodes[0], lock.Request{Keys: []string{"o"}, Owner: owner}, 50, 0); err != nil || n != 0 {
		t.Fatalf("raise = %d, %v; want 0 keys held", n, err)
	}
	if v, err := c.Get(ctx, "{o}:lock").Result(); err != nil || v != owner {
		t.Fatalf("lock key after the raise = %q, %v; want it unchanged", v, err)
	}
	// Gone (expired, or deleted by hand): free again.
	if err := c.Del(ctx, "{o}:lock").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"o"}, TTL: time.Minute, Holder: "new"}); err != nil {
		t.Fatalf("TryAcquire after the key is gone: %v", err)
	}
}

// The Redlock write-back (raise.lua) records a larger token in a lease its
// owner holds: the counter and the lease's value take it, and the lease keeps
// its TTL, holder and acquisition time.
func TestRaiseRewritesTheLeaseToken(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	const owner = "0123456789abcdef0123456789abcdef"
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"r"}, TTL: time.Minute, Holder: "raised", Owner: owner})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	before, err := l.Inspect(ctx, []string{"r"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if n, err := l.raiseOn(ctx, l.nodes[0], lock.Request{Keys: []string{"r"}, Owner: owner}, lease.Fence+10, 0); err != nil || n != 1 {
		t.Fatalf("raise = %d, %v; want 1 key held", n, err)
	}
	states, err := l.Inspect(ctx, []string{"r"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	st := states[0]
	if !st.Held || st.Fence != lease.Fence+10 || st.Holder != "raised" || !st.Acquired.Equal(before[0].Acquired) || time.Until(st.Expires) <= 50*time.Second {
		t.Fatalf("Inspect after the raise = held %v, fence %d, holder %q, acquired %v, expires in %v; want fence %d, %q, acquired %v, about a minute",
			st.Held, st.Fence, st.Holder, st.Acquired, time.Until(st.Expires), lease.Fence+10, "raised", before[0].Acquired)
	}
	if got, err := c.Get(ctx, "{r}:fence").Int64(); err != nil || got != lease.Fence+10 {
		t.Fatalf("counter after the raise = %d, %v; want %d", got, err, lease.Fence+10)
	}
}

// layoutServer starts a redis-server and returns a Locker on it and a client.
func layoutServer(t *testing.T) (*Locker, *goredis.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	s := redistest.Start(t)
	return newTestLocker(t, Config{Addrs: []string{s.Addr}}), s.Client()
}

// expectRelease waits (10 s at most) for the release message of key.
func expectRelease(t *testing.T, released <-chan string, key string) {
	t.Helper()
	select {
	case msg := <-released:
		if msg != key {
			t.Fatalf("release message %q; want %q", msg, key)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no release message for %q in 10s", key)
	}
}
