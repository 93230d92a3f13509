package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// testOpTimeout is generous: tests run on loaded 2-core machines, under -race.
const testOpTimeout = 5 * time.Second

// configFor returns a Config that reaches s as its test role (TLS with WithTLS).
func configFor(s *pgtest.Server) Config {
	return Config{
		Host:     s.Host,
		Port:     s.Port,
		Database: s.Database,
		User:     s.User,
		Password: s.Password,
		TLS:      s.TLSConfig(),
	}
}

func newTestLocker(t testing.TB, cfg Config, opts ...Option) *Locker {
	t.Helper()
	opts = append([]Option{WithOperationTimeout(testOpTimeout), WithWaiterTTL(time.Second)}, opts...)
	l, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// createSchema migrates the lock schema on the database cfg reaches, so
// that a fault run (an administrator locking the rows of its table, a
// failover right after the start) begins with the schema in place. Ping
// would not do: it checks the connection and nothing else.
func createSchema(t testing.TB, cfg Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := newTestLocker(t, cfg).ensureSchema(ctx); err != nil {
		t.Fatalf("create the lock schema: %v", err)
	}
}

func lockerFactory(cfg Config, opts ...Option) func(t *testing.T) lock.Locker {
	return func(t *testing.T) lock.Locker { return newTestLocker(t, cfg, opts...) }
}
