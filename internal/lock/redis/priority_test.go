package redis

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestOlderReleaseWaitersAheadOfBoost: a place queued by an older release
// (its counter ticket as its score, a since time that is not its ticket) is
// served before the waiters of this release, boosted or not, and a request
// with Replace still drops it by its arrival (its since time).
func TestOlderReleaseWaitersAheadOfBoost(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := srv.Client()
	key := "upgraded"
	l := newTestLocker(t, Config{Addrs: []string{srv.Addr}, Prefix: "up:"}, WithWaiterTTL(10*time.Second))
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx, h) }()
	// The older release's waiter: ticket 5 from the counter, since a second ago.
	old := mustOwner(t)
	now := time.Now()
	since := strconv.FormatInt(now.Add(-time.Second).UnixMicro(), 10)
	pipe := c.TxPipeline()
	pipe.ZAdd(ctx, "up:{"+key+"}:queue", goredis.Z{Score: 5, Member: old})
	pipe.ZAdd(ctx, "up:{"+key+"}:deadlines", goredis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: old})
	pipe.HSet(ctx, "up:{"+key+"}:waiters", old, since+" old")
	pipe.Set(ctx, "up:lockwarden:ticket", 5, 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	queue := func(req lock.Request) int {
		t.Helper()
		var held *lock.HeldError
		if _, err := l.TryAcquire(ctx, req); !errors.As(err, &held) {
			t.Fatalf("queueing %s: %v, want held", req.Holder, err)
		}
		return held.Position
	}
	base := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Queue: true}
	plain, boosted := base, base
	plain.Owner, plain.Holder = mustOwner(t), "plain"
	boosted.Owner, boosted.Holder, boosted.Boost = mustOwner(t), "boosted", lock.MaxBoost
	if p := queue(plain); p != 1 {
		t.Errorf("a new waiter at %d, want 1 (behind the older release's)", p)
	}
	if p := queue(boosted); p != 1 {
		t.Errorf("a boosted new waiter at %d, want 1 (behind the older release's, ahead of the new one)", p)
	}
	replacer := boosted
	replacer.Replace = true
	if p := queue(replacer); p != 0 {
		t.Errorf("the boosted waiter with Replace at %d, want 0 (the waiters that arrived before it dropped)", p)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if ws := st[0].Waiters; len(ws) != 1 || ws[0].Holder != "boosted" {
		t.Errorf("waiters after Replace: %+v, want the boosted one only", ws)
	}
}
