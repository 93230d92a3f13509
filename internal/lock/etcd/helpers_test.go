package etcd

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// testOpTimeout is generous: tests run on loaded 2-core machines, under
// -race, and through leader elections.
const testOpTimeout = 5 * time.Second

func newTestLocker(t testing.TB, cfg Config, opts ...Option) *Locker {
	t.Helper()
	opts = append([]Option{WithOpTimeout(testOpTimeout), WithWaiterTTL(time.Second)}, opts...)
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

// configFor connects to the cluster with its credentials and CA.
func configFor(c *etcdtest.Cluster) Config {
	return Config{Endpoints: c.Endpoints(), Username: c.Username, Password: c.Password, TLS: c.ClientTLS()}
}
