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
	if n, err := c.Exists(ctx, "{m}:meta").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS meta = %d, %v; want no metadata key", n, err)
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

// A lease taken before the one-key layout (the lock key's value is the bare
// owner token, the rest in a hash) is honoured across an upgrade: others
// are refused and told its holder, its owner renews, raises and releases it,
// and taking it again moves it to the new layout.
func TestLeaseOfTheOldLayoutIsHonoured(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	const owner = "0123456789abcdef0123456789abcdef"
	oldLease := func(key string, fence int64) *lock.Lease {
		t.Helper()
		pipe := c.TxPipeline()
		pipe.Set(ctx, "{"+key+"}:lock", owner, 10*time.Second)
		pipe.HSet(ctx, "{"+key+"}:meta", "holder", "old holder", "fence", fence, "acquired", 1700000000000000)
		pipe.Set(ctx, "{"+key+"}:fence", fence, 0)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		return &lock.Lease{Keys: []string{key}, Owner: owner, Holder: "old holder", Fence: fence, TTL: time.Minute}
	}
	lease := oldLease("o", 41)

	_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"o"}, TTL: time.Minute, Holder: "new"})
	var held *lock.HeldError
	if !errors.As(err, &held) || held.Holder != "old holder" || held.Fence != 41 {
		t.Fatalf("TryAcquire of a key held in the old layout = %v; want a HeldError naming %q with fence 41", err, "old holder")
	}
	states, err := l.Inspect(ctx, []string{"o"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; !st.Held || st.Holder != "old holder" || st.Fence != 41 || st.Acquired.UnixMicro() != 1700000000000000 {
		t.Fatalf("Inspect = held %v, holder %q, fence %d, acquired %v; want the old layout's", st.Held, st.Holder, st.Fence, st.Acquired)
	}
	if _, err := l.Renew(ctx, lease, time.Minute); err != nil {
		t.Fatalf("Renew of an old-layout lease: %v", err)
	}
	if pttl, err := c.PTTL(ctx, "{o}:lock").Result(); err != nil || pttl <= 50*time.Second {
		t.Fatalf("PTTL after Renew = %v, %v; want about a minute", pttl, err)
	}
	if n, err := l.raiseOn(ctx, l.nodes[0], lock.Request{Keys: []string{"o"}, Owner: owner}, 50); err != nil || n != 1 {
		t.Fatalf("raise = %d, %v; want 1 key held", n, err)
	}
	if f, err := c.HGet(ctx, "{o}:meta", "fence").Result(); err != nil || f != "50" {
		t.Fatalf("old layout's fence after the raise = %q, %v; want 50", f, err)
	}

	// Taken again by its owner: one key, the new layout, the metadata gone.
	again, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"o"}, TTL: time.Minute, Holder: "old holder", Owner: owner})
	if err != nil {
		t.Fatalf("TryAcquire by its owner: %v", err)
	}
	if v, err := c.Get(ctx, "{o}:lock").Result(); err != nil || redistest.LeaseOwner(v) != owner || v == owner {
		t.Fatalf("lock key after the owner took it again = %q, %v; want the new layout", v, err)
	}
	if n, err := c.Exists(ctx, "{o}:meta").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS meta = %d, %v; want the old metadata gone", n, err)
	}
	// The raise keeps the lease's TTL and rewrites its token.
	if n, err := l.raiseOn(ctx, l.nodes[0], lock.Request{Keys: []string{"o"}, Owner: owner}, again.Fence+10); err != nil || n != 1 {
		t.Fatalf("raise = %d, %v; want 1 key held", n, err)
	}
	states, err = l.Inspect(ctx, []string{"o"})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st := states[0]; st.Fence != again.Fence+10 || st.Holder != "old holder" || time.Until(st.Expires) <= 50*time.Second {
		t.Fatalf("Inspect after the raise = fence %d holder %q expires in %v; want %d, %q, about a minute", st.Fence, st.Holder, time.Until(st.Expires), again.Fence+10, "old holder")
	}

	// Released in the old layout: both keys go, and waiters hear the token.
	lease = oldLease("p", 77)
	released, err := l.Watch(ctx, "p")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expectRelease(t, released, "p")
	if n, err := c.Exists(ctx, "{p}:lock", "{p}:meta").Result(); err != nil || n != 0 {
		t.Fatalf("after the release %d of lock and meta are left (%v); want none", n, err)
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
