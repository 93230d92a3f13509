package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// A weighted holder and a weighted waiter record their weight next to their
// limit and their since time; a request of weight 1 writes what it wrote
// before weights existed, and holders whose names look like those fields
// read back whole.
func TestWeightLayout(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	const key = "wl"
	req := func(holder string, weight int, queue bool) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: holder, Limit: 4, Weight: weight, Queue: queue}
	}
	heavy, err := l.TryAcquire(ctx, req("3:2 heavy", 3, false))
	if err != nil {
		t.Fatalf("weight 3: %v", err)
	}
	light, err := l.TryAcquire(ctx, req("1 2 light", 1, false))
	if err != nil {
		t.Fatalf("weight 1: %v", err)
	}
	meta := func(owner string) string {
		t.Helper()
		v, err := c.HGet(ctx, "{"+key+"}:slotmeta", owner).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := meta(heavy.Owner); !strings.HasPrefix(v, fmt.Sprintf("%d ", heavy.Fence)) || !strings.HasSuffix(v, " 4:3 3:2 heavy") {
		t.Errorf("slotmeta of weight 3 = %q; want <fence> <acquired us> 4:3 <holder>", v)
	}
	if v := meta(light.Owner); !strings.HasPrefix(v, fmt.Sprintf("%d ", light.Fence)) || !strings.HasSuffix(v, " 4 1 2 light") {
		t.Errorf("slotmeta of weight 1 = %q; want <fence> <acquired us> 4 <holder>, as before weights", v)
	}
	// Weights 3 + 1 fill the limit of 4: a weight-2 waiter queues.
	waiter := req("2 w", 2, true)
	var held *lock.HeldError
	if _, err := l.TryAcquire(ctx, waiter); !errors.As(err, &held) || held.Holders != 2 || held.Position != 0 {
		t.Fatalf("weight 2 beside weights 3+1 on a limit of 4: %v; want held by 2 holders, queued at the head", err)
	}
	info, err := c.HGet(ctx, "{"+key+"}:waiters", waiter.Owner).Result()
	if err != nil {
		t.Fatal(err)
	}
	since, rest, ok := strings.Cut(info, ":")
	if _, perr := strconv.ParseInt(since, 10, 64); !ok || perr != nil || rest != "2 2 w" {
		t.Errorf("waiters entry of weight 2 = %q; want <since us>:2 <holder>", info)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, h := range st[0].Holders {
		got[h.Holder] = h.Weight
	}
	if len(got) != 2 || got["3:2 heavy"] != 3 || got["1 2 light"] != 1 {
		t.Errorf("Inspect holders (holder -> weight) = %v; want \"3:2 heavy\" 3, \"1 2 light\" 1", got)
	}
	if ws := st[0].Waiters; len(ws) != 1 || ws[0].Holder != "2 w" || ws[0].Since.IsZero() {
		t.Errorf("Inspect waiters = %+v; want \"2 w\" with its since time", ws)
	}
	// The release of the weight-1 holder leaves 3 of 4 slots taken: the
	// waiter still waits; the heavy holder's release lets it in.
	release := func(lease *lock.Lease) {
		t.Helper()
		if err := l.Release(ctx, lease); err != nil {
			t.Fatalf("Release %s: %v", lease.Holder, err)
		}
	}
	release(light)
	if _, err := l.TryAcquire(ctx, waiter); !errors.As(err, &held) {
		t.Fatalf("weight 2 beside weight 3 on a limit of 4: %v; want held", err)
	}
	release(heavy)
	granted, err := l.TryAcquire(ctx, waiter)
	if err != nil {
		t.Fatalf("weight 2 alone: %v", err)
	}
	if granted.Weight != 2 {
		t.Errorf("lease of weight 2: Weight %d", granted.Weight)
	}
	if n, err := c.Exists(ctx, "{"+key+"}:waiters").Result(); err != nil || n != 0 {
		t.Errorf("waiters after the grant: EXISTS %d, %v; want gone", n, err)
	}
	release(granted)
}

// TestOlderReleaseSlotsAndWaitersWeighOne: semaphore holders and waiters
// the previous release wrote (no weight in slotmeta or waiters) take one
// slot each. On a limit of 4 with two such holders and one such waiter, a
// weight-2 request is refused (2 + 1 + 2 > 4) and queues behind the waiter,
// and an unqueued weight-1 request is refused behind both; once the old
// waiter has left, the weight-2 one fits (2 + 2). Inspect reports weight 1
// for the old holders.
func TestOlderReleaseSlotsAndWaitersWeighOne(t *testing.T) {
	ctx := context.Background()
	l, c := layoutServer(t)
	const key = "old"
	b := "{" + key + "}:"
	now := time.Now()
	expiry := float64(now.Add(time.Minute).UnixMilli())
	pipe := c.TxPipeline()
	for i, o := range []string{"old-holder-1", "old-holder-2"} {
		fence := int64(100 + i)
		pipe.ZAdd(ctx, b+"slots", goredis.Z{Score: expiry, Member: o})
		pipe.ZAdd(ctx, b+"slotfences", goredis.Z{Score: float64(fence), Member: o})
		pipe.HSet(ctx, b+"slotmeta", o, fmt.Sprintf("%d %d 4 %s", fence, now.UnixMicro(), o))
		pipe.Set(ctx, b+"fence", fence, 0)
	}
	const old = "old-waiter"
	pipe.ZAdd(ctx, b+"queue", goredis.Z{Score: 5, Member: old})
	pipe.ZAdd(ctx, b+"deadlines", goredis.Z{Score: expiry, Member: old})
	pipe.HSet(ctx, b+"waiters", old, strconv.FormatInt(now.Add(-time.Second).UnixMicro(), 10)+" old waiter")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if hs := st[0].Holders; st[0].HolderCount != 2 || len(hs) != 2 || hs[0].Weight != 1 || hs[1].Weight != 1 || hs[0].Holder != "old-holder-1" {
		t.Fatalf("Inspect of the older release's holders: %d holders %+v; want 2 of weight 1", st[0].HolderCount, hs)
	}
	if ws := st[0].Waiters; len(ws) != 1 || ws[0].Holder != "old waiter" {
		t.Fatalf("Inspect of the older release's waiter: %+v", ws)
	}
	two := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: "two", Limit: 4, Weight: 2, Queue: true}
	var held *lock.HeldError
	if _, err := l.TryAcquire(ctx, two); !errors.As(err, &held) || held.Holders != 2 || held.Position != 1 {
		t.Fatalf("weight 2 behind an older release's waiter, beside two of its holders, limit 4: %v; want held by 2, queued second", err)
	}
	one := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: "one", Limit: 4}
	if _, err := l.TryAcquire(ctx, one); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("unqueued weight 1 behind waiters of weights 1 and 2, two holders, limit 4: %v; want ErrNotAcquired", err)
	}
	// The older release's waiter leaves (its Dequeue).
	pipe = c.TxPipeline()
	pipe.ZRem(ctx, b+"queue", old)
	pipe.ZRem(ctx, b+"deadlines", old)
	pipe.HDel(ctx, b+"waiters", old)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, two)
	if err != nil {
		t.Fatalf("weight 2 beside two older holders of weight 1, limit 4: %v; want it taken", err)
	}
	st, err = l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, h := range st[0].Holders {
		got[h.Holder] = h.Weight
	}
	if st[0].HolderCount != 3 || got["old-holder-1"] != 1 || got["old-holder-2"] != 1 || got["two"] != 2 {
		t.Fatalf("Inspect: %d holders, weights %v; want 3: the older ones 1, two 2", st[0].HolderCount, got)
	}
	if _, err := l.TryAcquire(ctx, one); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("weight 1 with 4 of 4 slots taken: %v; want ErrNotAcquired", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockWaiterKeepsItsPlaceWhereGranted: on 3 nodes a semaphore of 2
// slots needs every node. A weight-2 waiter at the head, granted on the two
// nodes its blocker has left but refused on the third, releases those grants
// and keeps its place there: the weight-1 waiter behind it is not let
// through on those nodes (had the grants taken the place, each waiter would
// be granted where the other is not, attempt after attempt). Once it holds
// the lease it has left every queue.
func TestRedlockWaiterKeepsItsPlaceWhereGranted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithWaiterTTL(10*time.Second))
	const key = "kp"
	b := "{" + key + "}:"
	req := func(holder string, weight int) lock.Request {
		return lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: holder, Limit: 2, Weight: weight, Queue: true}
	}
	blocker, err := l.TryAcquire(ctx, req("blocker", 1))
	if err != nil {
		t.Fatal(err)
	}
	heavy, light := req("heavy", 2), req("light", 1)
	for _, r := range []lock.Request{heavy, light} {
		if _, err := l.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("%s beside the blocker: %v; want queued", r.Holder, err)
		}
	}
	// The blocker's slot goes on nodes 0 and 1 only.
	for _, s := range servers[:2] {
		c := s.Client()
		if err := c.ZRem(ctx, b+"slots", blocker.Owner).Err(); err != nil {
			t.Fatal(err)
		}
		c.ZRem(ctx, b+"slotfences", blocker.Owner)
		c.HDel(ctx, b+"slotmeta", blocker.Owner)
	}
	if _, err := l.TryAcquire(ctx, heavy); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("heavy, granted on 2 of 3 nodes: %v; want ErrNotAcquired", err)
	}
	waitIdle(t, l)
	queued := func(s *redistest.Server, owner string) bool {
		t.Helper()
		_, err := s.Client().ZScore(ctx, b+"queue", owner).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	holds := func(s *redistest.Server, owner string) bool {
		t.Helper()
		_, err := s.Client().ZScore(ctx, b+"slots", owner).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	for i, s := range servers {
		if !queued(s, heavy.Owner) || holds(s, heavy.Owner) {
			t.Fatalf("node %d after heavy's failed attempt: queued %v, holds %v; want queued, holding nothing", i, queued(s, heavy.Owner), holds(s, heavy.Owner))
		}
	}
	if _, err := l.TryAcquire(ctx, light); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("light behind heavy: %v; want ErrNotAcquired", err)
	}
	waitIdle(t, l)
	for i, s := range servers[:2] {
		if holds(s, light.Owner) {
			t.Fatalf("node %d: light holds a slot behind heavy's place", i)
		}
	}
	if err := l.Release(ctx, blocker); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, heavy)
	if err != nil {
		t.Fatalf("heavy once the blocker is gone: %v", err)
	}
	waitIdle(t, l)
	for i, s := range servers {
		if queued(s, heavy.Owner) || !holds(s, heavy.Owner) {
			t.Fatalf("node %d after heavy's grant: queued %v, holds %v; want holding, out of the queue", i, queued(s, heavy.Owner), holds(s, heavy.Owner))
		}
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if got, err := l.TryAcquire(ctx, light); err != nil {
		t.Fatalf("light once heavy released: %v", err)
	} else if err := l.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}
