package postgres

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestUpgradeFromSchemaVersion5 is a rolling upgrade across migration 6:
// the slots and the waiter an operator of version 5 left (its acquire,
// without a weight, as that code calls it) take and ask for one slot each
// after the migration, in Inspect and in admission; a weighted request of
// this version is admitted against them by weight, behind the version-5
// waiter; and the version-5 operator, still running, keeps its waiter's
// place and is refused a slot that the weights taken since fill.
func TestUpgradeFromSchemaVersion5(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "upgrade5"
	migrateTo(t, cfg, 5)
	raw := s.Conn(t)
	const key, limit = "upgrade5", 3
	type result struct {
		ok       bool
		fence    int64
		position int32
		holders  int32
	}
	v5Acquire := func(owner, holder string, queue bool) result {
		t.Helper()
		var r result
		if err := raw.QueryRow(ctx, "SELECT o_ok, o_fence, o_position, o_busy_holders FROM upgrade5.acquire($1, $2, $3, 30000, $4, 30000, $5, $6, false, false, 0)",
			encodeKeys([]string{key}), ownerDigest(owner), holder, queue, lock.MaxFence-1, limit).Scan(&r.ok, &r.fence, &r.position, &r.holders); err != nil {
			t.Fatalf("acquire through schema version 5: %v", err)
		}
		return r
	}
	v5Lease := func(owner, holder string, r result) *lock.Lease {
		return &lock.Lease{Keys: []string{key}, Owner: owner, Holder: holder, Fence: r.fence, TTL: 30 * time.Second, Limit: limit}
	}
	var old []*lock.Lease
	for _, h := range []string{"old1", "old2", "old3"} {
		o := newOwner(t)
		r := v5Acquire(o, h, false)
		if !r.ok {
			t.Fatalf("slot %s through schema version 5: %+v", h, r)
		}
		old = append(old, v5Lease(o, h, r))
	}
	waiter := newOwner(t)
	if r := v5Acquire(waiter, "old-waiter", true); r.ok || r.position != 0 || r.holders != limit {
		t.Fatalf("version-5 waiter on a full key: %+v; want queued at position 0 behind %d holders", r, limit)
	}

	upgraded := newTestLocker(t, cfg, WithWaiterTTL(30*time.Second))
	weights := func(when string, want map[string]int) {
		t.Helper()
		st, err := upgraded.Inspect(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, h := range st[0].Holders {
			got[h.Holder] = h.Weight
		}
		if len(got) != len(want) || st[0].HolderCount != len(want) {
			t.Fatalf("Inspect %s: %d holders, weights %v; want %v", when, st[0].HolderCount, got, want)
		}
		for h, w := range want {
			if got[h] != w {
				t.Fatalf("Inspect %s: weights %v; want %v", when, got, want)
			}
		}
	}
	weights("after the upgrade", map[string]int{"old1": 1, "old2": 1, "old3": 1})
	var version int
	if err := raw.QueryRow(ctx, "SELECT max(version) FROM upgrade5.schema_migrations").Scan(&version); err != nil || version != LatestSchemaVersion() {
		t.Fatalf("schema version after the upgrade: %d, %v; want %d", version, err, LatestSchemaVersion())
	}
	wantOrder(t, upgraded, key, "old-waiter")

	heavy := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Holder: "heavy", Owner: newOwner(t), Queue: true, Limit: limit, Weight: 2}
	if he := mustRefuse(t, upgraded, heavy); he.Position != 1 || he.Waiters != 2 || he.Holders != limit {
		t.Fatalf("weight 2 on a full key after the upgrade: position %d of %d, %d holders; want 1 of 2 (behind the version-5 waiter), %d holders", he.Position, he.Waiters, he.Holders, limit)
	}
	for _, l := range old[:2] {
		if err := upgraded.Release(ctx, l); err != nil {
			t.Fatalf("Release of the version-5 slot %s: %v", l.Holder, err)
		}
	}
	// One slot held (weight 1) and the version-5 waiter ahead (weight 1):
	// weight 2 does not fit in the two slots free.
	if he := mustRefuse(t, upgraded, heavy); he.Position != 1 || he.Holders != 1 {
		t.Fatalf("weight 2 behind a version-5 waiter, two slots free: position %d, %d holders; want refused at position 1 with 1 holder", he.Position, he.Holders)
	}
	r := v5Acquire(waiter, "old-waiter", true)
	if !r.ok {
		t.Fatalf("the version-5 waiter at the head, two slots free: %+v; want a slot", r)
	}
	old = append(old, v5Lease(waiter, "old-waiter", r))
	if he := mustRefuse(t, upgraded, heavy); he.Position != 0 || he.Holders != 2 {
		t.Fatalf("weight 2 with one slot free: position %d, %d holders; want refused at the head with 2 holders", he.Position, he.Holders)
	}
	if err := upgraded.Release(ctx, old[2]); err != nil {
		t.Fatalf("Release of the version-5 slot old3: %v", err)
	}
	got := mustTry(t, upgraded, heavy)
	if got.Weight != 2 {
		t.Fatalf("lease of weight 2: Weight %d", got.Weight)
	}
	weights("with a weighted lease", map[string]int{"old-waiter": 1, "heavy": 2})
	if r := v5Acquire(newOwner(t), "late", false); r.ok || r.holders != 2 {
		t.Fatalf("a version-5 request with weights 1+2 held on a limit of 3: %+v; want refused with 2 holders", r)
	}
	if err := upgraded.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := upgraded.Release(ctx, old[3]); err != nil {
		t.Fatal(err)
	}
	weights("after the releases", map[string]int{})
}
