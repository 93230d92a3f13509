package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// migrateTo applies the migrations up to version, and no further, to cfg's
// schema: the database as an operator of that version left it.
func migrateTo(t *testing.T, cfg Config, version int) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) <= version {
		t.Fatalf("%d migrations: this test upgrades from version %d to %d", len(ms), version, version+1)
	}
	l := newTestLocker(t, cfg)
	if err := l.withConn(ctx, func(ctx context.Context, c *pgx.Conn) error { return l.migrateOn(ctx, c, ms[:version]) }); err != nil {
		t.Fatalf("migrate to version %d: %v", version, err)
	}
}

// TestUpgradeFromSchemaVersion1 is a rolling upgrade across migration 2: a
// lease taken and renewed by a version-1 operator (migration 1's functions,
// called as that code calls them) is renewed and released by this version
// with its token after the migration, and the version-1 operator, still
// running until its pod is gone, can keep renewing it meanwhile.
func TestUpgradeFromSchemaVersion1(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "upgrade"
	migrateTo(t, cfg, 1)
	raw := s.Conn(t)
	owner, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"upgrade-a", "upgrade-b"}
	var ok bool
	var fence int64
	if err := raw.QueryRow(ctx, "SELECT o_ok, o_fence FROM upgrade.acquire($1, $2, 'v1', 30000, false, 1000, $3)",
		encodeKeys(keys), ownerDigest(owner), lock.MaxFence-1).Scan(&ok, &fence); err != nil || !ok {
		t.Fatalf("acquire through schema version 1: ok %v, %v", ok, err)
	}
	v1Renew := func(when string) {
		t.Helper()
		var lost int32
		if err := raw.QueryRow(ctx, "SELECT o_lost FROM upgrade.renew(ARRAY[1, 1], $1, ARRAY[$2], 30000)",
			encodeKeys(keys), ownerDigest(owner)).Scan(&lost); err != nil || lost != 0 {
			t.Fatalf("renew through schema version 1's function %s: lost %d, %v", when, lost, err)
		}
	}
	v1Renew("before the upgrade")

	upgraded := newTestLocker(t, cfg)
	lease := &lock.Lease{Keys: keys, Owner: owner, Holder: "v1", Fence: fence, TTL: 30 * time.Second}
	renewed, err := upgraded.Renew(ctx, lease, 30*time.Second)
	if err != nil {
		t.Fatalf("Renew after the upgrade of a lease taken under version 1: %v", err)
	}
	var version int
	if err := raw.QueryRow(ctx, "SELECT max(version) FROM upgrade.schema_migrations").Scan(&version); err != nil || version != LatestSchemaVersion() {
		t.Fatalf("schema version after the upgrade: %d, %v; want %d", version, err, LatestSchemaVersion())
	}
	v1Renew("after the upgrade (the old operator, until it is gone)")
	if err := upgraded.Release(ctx, renewed); err != nil {
		t.Fatalf("Release after the upgrade: %v", err)
	}
	st, err := upgraded.Inspect(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range st {
		if k.Held {
			t.Fatalf("Inspect(%s) after the release = %+v: want free", k.Key, k)
		}
	}
}
