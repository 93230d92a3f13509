package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// testNodeTimeout is generous: tests run on loaded 2-core machines, under -race.
const testNodeTimeout = time.Second

func newTestLocker(t testing.TB, cfg Config, opts ...Option) *Locker {
	t.Helper()
	opts = append([]Option{WithNodeTimeout(testNodeTimeout), WithWaiterTTL(time.Second)}, opts...)
	l, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func addrs(servers []*redistest.Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}

// tlsFor trusts the CAs of all the servers (each test server has its own).
func tlsFor(servers ...*redistest.Server) *tls.Config {
	pool := x509.NewCertPool()
	for _, s := range servers {
		pool.AppendCertsFromPEM(s.CAPEM)
	}
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

func lockerFactory(cfg Config, opts ...Option) func(t *testing.T) lock.Locker {
	return func(t *testing.T) lock.Locker { return newTestLocker(t, cfg, opts...) }
}

// waitIdle waits until none of l's calls that outlive their operation (a
// Redlock operation returns once a majority answered) still runs.
func waitIdle(t testing.TB, l *Locker) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return l.bg.running() == 0, nil
	}); err != nil {
		t.Fatalf("%d background calls still run: %v", l.bg.running(), err)
	}
}
