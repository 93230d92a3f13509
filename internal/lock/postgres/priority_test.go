package postgres

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/faketime"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// queueOrder returns the holders queued on key, in the queue's order.
func queueOrder(t *testing.T, l *Locker, key string) []string {
	t.Helper()
	st, err := l.Inspect(ctxFor(t, 10*time.Second), []string{key})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range st[0].Waiters {
		got = append(got, w.Holder)
	}
	return got
}

// wantOrder fails unless the queue of key is want, in that order.
func wantOrder(t *testing.T, l *Locker, key string, want ...string) {
	t.Helper()
	got := queueOrder(t, l, key)
	if len(got) != len(want) {
		t.Fatalf("queue of %s: %q; want %q", key, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("queue of %s: %q; want %q", key, got, want)
		}
	}
}

// TestUpgradeFromSchemaVersion4 is a rolling upgrade across migration 5:
// the waiters an operator of version 4 queued (its acquire, without a
// boost, as that code calls it) keep their order, ranked at the time they
// joined; a request of this version without a boost queues behind them, a
// boosted one ahead of them; the version-4 operator, still running, keeps
// its waiters' places and queues new ones at the back.
func TestUpgradeFromSchemaVersion4(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "upgrade4"
	migrateTo(t, cfg, 4)
	raw := s.Conn(t)
	key := "upgrade4"
	type result struct {
		ok       bool
		fence    int64
		position int32
	}
	v4Acquire := func(owner, holder string, queue bool) result {
		t.Helper()
		var r result
		if err := raw.QueryRow(ctx, "SELECT o_ok, o_fence, o_position FROM upgrade4.acquire($1, $2, $3, 30000, $4, 30000, $5, 0, false, false)",
			encodeKeys([]string{key}), ownerDigest(owner), holder, queue, lock.MaxFence-1).Scan(&r.ok, &r.fence, &r.position); err != nil {
			t.Fatalf("acquire through schema version 4: %v", err)
		}
		return r
	}
	holder, old1, old2, old3 := newOwner(t), newOwner(t), newOwner(t), newOwner(t)
	h := v4Acquire(holder, "holder", false)
	if !h.ok {
		t.Fatalf("acquire through schema version 4: %+v", h)
	}
	for i, o := range []string{old1, old2} {
		if r := v4Acquire(o, []string{"old1", "old2"}[i], true); r.ok || r.position != int32(i) {
			t.Fatalf("version-4 waiter %d: %+v; want queued at position %d", i+1, r, i)
		}
	}

	upgraded := newTestLocker(t, cfg, WithWaiterTTL(30*time.Second))
	fresh := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Holder: "fresh", Owner: newOwner(t), Queue: true}
	if he := mustRefuse(t, upgraded, fresh); he.Position != 2 || he.Waiters != 3 {
		t.Fatalf("a request without a boost after the upgrade: position %d of %d; want 2 of 3, behind the version-4 waiters", he.Position, he.Waiters)
	}
	var version int
	if err := raw.QueryRow(ctx, "SELECT max(version) FROM upgrade4.schema_migrations").Scan(&version); err != nil || version != LatestSchemaVersion() {
		t.Fatalf("schema version after the upgrade: %d, %v; want %d", version, err, LatestSchemaVersion())
	}
	if r := v4Acquire(old2, "old2", true); r.ok || r.position != 1 {
		t.Fatalf("the version-4 waiter calling again: %+v; want its place, 1", r)
	}
	if r := v4Acquire(old3, "old3", true); r.ok || r.position != 3 {
		t.Fatalf("a new version-4 waiter: %+v; want at the back, position 3", r)
	}
	boosted := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Holder: "boosted", Owner: newOwner(t), Queue: true, Boost: time.Hour}
	if he := mustRefuse(t, upgraded, boosted); he.Position != 0 || he.Waiters != 5 {
		t.Fatalf("a boosted request: position %d of %d; want 0 of 5", he.Position, he.Waiters)
	}
	wantOrder(t, upgraded, key, "boosted", "old1", "old2", "fresh", "old3")

	if err := upgraded.Release(ctx, &lock.Lease{Keys: []string{key}, Owner: holder, Holder: "holder", Fence: h.fence, TTL: 30 * time.Second}); err != nil {
		t.Fatalf("Release of the version-4 lease: %v", err)
	}
	if r := v4Acquire(old1, "old1", true); r.ok || r.position != 1 {
		t.Fatalf("the first version-4 waiter at the release: %+v; want refused at position 1, behind the boosted one", r)
	}
	got := mustTry(t, upgraded, boosted)
	if err := upgraded.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
	if r := v4Acquire(old1, "old1", true); !r.ok {
		t.Fatalf("the first version-4 waiter after the boosted one: %+v; want the key", r)
	}
}

// TestArrivalNeverGoesBack: the database server's clock steps back after a
// waiter joined; a later waiter with the same boost still queues behind it
// (an arrival is at least the key's last one plus a microsecond), and a
// boosted one, its arrival counted from there too (a microsecond after
// them), passes both.
func TestArrivalNeverGoesBack(t *testing.T) {
	faketime.Require(t)
	s := pgtest.Start(t, pgtest.WithClockControl())
	l := newTestLocker(t, configFor(s), WithWaiterTTL(30*time.Second))
	key := "arrival"
	mustTry(t, l, lock.Request{Keys: []string{key}, TTL: time.Hour, Holder: "holder", Owner: newOwner(t)})
	if err := s.SetClockOffset(10 * time.Minute); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "ahead", Owner: newOwner(t), Queue: true})
	if err := s.SetClockOffset(0); err != nil {
		t.Fatal(err)
	}
	if he := mustRefuse(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "behind", Owner: newOwner(t), Queue: true}); he.Position != 1 {
		t.Fatalf("a waiter without a boost after the clock went back 10m: position %d; want 1, behind the one that came first", he.Position)
	}
	if he := mustRefuse(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "boosted", Owner: newOwner(t), Queue: true, Boost: time.Second}); he.Position != 0 {
		t.Fatalf("a waiter with a second's boost: position %d; want 0, having arrived a microsecond after the others", he.Position)
	}
	wantOrder(t, l, key, "boosted", "ahead", "behind")
}
