package postgres

import (
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

func lockerFactory(cfg Config, opts ...Option) func(t *testing.T) lock.Locker {
	return func(t *testing.T) lock.Locker { return newTestLocker(t, cfg, opts...) }
}
