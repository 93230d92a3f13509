package zookeeper

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// JVMs start slowly on a loaded machine, so one standalone server and one
// 3-server ensemble serve every test of the binary. They are started on first
// use and stopped by TestMain. Tests use fresh keys (and roots), so they do
// not see each other's nodes; tests that break servers heal them before they
// return.
var (
	sharedDir string
	sharedMu  sync.Mutex
	shared    = map[int]*zktest.Ensemble{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	sharedMu.Lock()
	for _, e := range shared {
		e.Close()
	}
	sharedMu.Unlock()
	if sharedDir != "" {
		_ = os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

// sharedServers returns the shared ensemble of n servers (1: standalone),
// starting it on first use. It skips t when the servers cannot run here (see
// zktest.Require).
func sharedServers(t testing.TB, n int) *zktest.Ensemble {
	t.Helper()
	zktest.Require(t)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if e := shared[n]; e != nil {
		if err := e.WaitLeader(60 * time.Second); err != nil {
			t.Fatalf("shared ensemble of %d: %v", n, err)
		}
		return e
	}
	if sharedDir == "" {
		d, err := os.MkdirTemp("", "lockwarden-zk-")
		if err != nil {
			t.Fatal(err)
		}
		sharedDir = d
	}
	e, err := zktest.Launch(sharedDir, n)
	if err != nil {
		t.Fatalf("start %d ZooKeeper server(s): %v", n, err)
	}
	shared[n] = e
	return e
}

// logsOnFailure prints the servers' log tails when t fails.
func logsOnFailure(t testing.TB, e *zktest.Ensemble) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ZooKeeper logs:\n%s", e.LogTails(30))
		}
	})
}

// testSessionTimeout outlives a leader election on a loaded machine.
const testSessionTimeout = 10 * time.Second

// testOpTimeout is generous: tests run on loaded 2-core machines, under -race.
const testOpTimeout = 5 * time.Second

func newTestLocker(t testing.TB, cfg Config, opts ...Option) *Locker {
	t.Helper()
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = testSessionTimeout
	}
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

// rawConn is a plain ZooKeeper client, closed when t ends.
func rawConn(t testing.TB, servers []string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(servers, testSessionTimeout, zk.WithLogger(quiet{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// countingDial dials with net.Dialer and counts the connections.
type countingDial struct {
	mu    sync.Mutex
	n     int
	conns []net.Conn
}

func (d *countingDial) dial(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.n++
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return c, nil
}

func (d *countingDial) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// cut closes every connection dialed so far.
func (d *countingDial) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}
