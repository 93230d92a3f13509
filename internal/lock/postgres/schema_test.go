package postgres

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestMigrations: replicas starting together migrate once; a schema from a
// newer version is refused; a schema an administrator created for a role
// without CREATE on the database works.
func TestMigrations(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "replicas"

	var wg sync.WaitGroup
	for range 4 {
		l := newTestLocker(t, cfg)
		wg.Go(func() {
			if _, err := l.Inspect(ctx, []string{"k"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	raw := s.Conn(t)
	var n, v int
	if err := raw.QueryRow(ctx, "SELECT count(*), max(version) FROM replicas.schema_migrations").Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	if n != LatestSchemaVersion() || v != LatestSchemaVersion() {
		t.Fatalf("schema_migrations has %d rows up to version %d, want each of 1..%d once", n, v, LatestSchemaVersion())
	}

	if _, err := raw.Exec(ctx, "INSERT INTO replicas.schema_migrations (version, name) VALUES (1000, 'from the future')"); err != nil {
		t.Fatal(err)
	}
	_, err := newTestLocker(t, cfg).TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Second})
	if !errors.Is(err, ErrSchemaTooNew) || !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("on a newer schema: %v, want ErrSchemaTooNew and ErrBackendUnavailable", err)
	}

	// The documented alternative grants: the schema pre-created for a role
	// that has only CONNECT.
	for _, q := range []string{
		"CREATE ROLE narrow LOGIN PASSWORD 'narrow-pw'",
		"GRANT CONNECT ON DATABASE " + pgtest.Database + " TO narrow",
		"CREATE SCHEMA narrow_locks AUTHORIZATION narrow",
	} {
		if err := s.SuperuserExec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	narrow := configFor(s)
	narrow.User, narrow.Password, narrow.Schema = "narrow", "narrow-pw", "narrow_locks"
	l := newTestLocker(t, narrow)
	mustCycle(t, l, "narrow")
	// And without the schema, that role cannot create one: the error says so.
	narrow.Schema = "not_granted"
	_, err = newTestLocker(t, narrow).Inspect(ctx, []string{"k"})
	if !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("schema creation without CREATE: %v", err)
	}
	t.Logf("without CREATE on the database: %v", err)
}
