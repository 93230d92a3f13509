package zookeeper

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// TestDialUsedForEveryConnection: with Config.Dial set, the first connection
// and every reconnection go through it, and a Dial that refuses leaves the
// Locker with nothing but ErrBackendUnavailable.
func TestDialUsedForEveryConnection(t *testing.T) {
	e := sharedServers(t, 1)
	ctx := ctxT(t, 60*time.Second)
	d := &countingDial{}
	l := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/dial", Dial: d.dial})
	cycle := func(ctx context.Context) error {
		lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{testKey("dial")}, TTL: 10 * time.Second})
		if err != nil {
			return err
		}
		return l.Release(ctx, lease)
	}
	if err := cycle(ctx); err != nil {
		t.Fatal(err)
	}
	first := d.count()
	if first < 1 {
		t.Fatalf("Dial called %d times after a lease cycle: the connection bypassed it", first)
	}
	d.cut()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return cycle(ctx) == nil && d.count() > first, nil
	})
	if err != nil {
		t.Fatalf("after the connection was cut: %d dials (was %d): %v", d.count(), first, err)
	}

	var refused atomic.Int32
	refuse := func(context.Context, string, string) (net.Conn, error) {
		refused.Add(1)
		return nil, errors.New("refused by the network policy")
	}
	r := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/dial", Dial: refuse}, WithOperationTimeout(time.Second))
	_, err = r.TryAcquire(ctxT(t, 20*time.Second), lock.Request{Keys: []string{testKey("refused")}, TTL: 10 * time.Second})
	var ne *lock.NodeError
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.As(err, &ne) {
		t.Fatalf("TryAcquire through a refusing Dial: %v, want ErrBackendUnavailable with a NodeError", err)
	}
	if err := r.Ping(ctxT(t, 20*time.Second)); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Ping through a refusing Dial: %v, want ErrBackendUnavailable", err)
	}
	if refused.Load() == 0 {
		t.Fatal("the refusing Dial was never called")
	}
}

// TestDigestKeepsOthersOut: with Config.Digest, a client without the
// credentials (or with wrong ones) can neither read nor change the lock nodes.
func TestDigestKeepsOthersOut(t *testing.T) {
	e := sharedServers(t, 1)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/acl", Digest: "lockwarden:s3cret"}
	l := newTestLocker(t, cfg)
	key := testKey("acl")
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	wrong := rawConn(t, e.Addrs())
	if err := wrong.AddAuth("digest", []byte("lockwarden:wrong")); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*zk.Conn{"unauthenticated": rawConn(t, e.Addrs()), "wrong password": wrong} {
		if _, _, err := c.Get(l.holderPath(key)); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s client reads the holder node: %v, want ErrNoAuth", name, err)
		}
		if _, _, err := c.Children(l.keyPath(key)); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s client lists the key node: %v, want ErrNoAuth", name, err)
		}
		if err := c.Delete(l.holderPath(key), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s client deletes the holder node: %v, want ErrNoAuth", name, err)
		}
		if _, err := c.Set(l.keyPath(key), nil, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s client writes the key node: %v, want ErrNoAuth", name, err)
		}
		if _, err := c.Create(l.keyPath(key)+"/holder2", nil, 0, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s client creates under the key node: %v, want ErrNoAuth", name, err)
		}
	}
	open := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/acl"})
	if _, err := open.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second}); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Errorf("TryAcquire by a Locker without the digest: %v, want ErrBackendUnavailable (no auth)", err)
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil || !st[0].Held || st[0].Fence != lease.Fence {
		t.Fatalf("Inspect = %+v, %v; want still held with fence %d", st, err, lease.Fence)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestNegotiatedSessionTimeout: the Locker learns the session timeout the
// ensemble granted (zktest's servers grant at most MaxSessionTimeout), and
// lease validity never exceeds it.
func TestNegotiatedSessionTimeout(t *testing.T) {
	e := sharedServers(t, 1)
	l := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/negotiated", SessionTimeout: 10 * time.Minute})
	if err := l.Ping(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := l.SessionTimeout(); got != zktest.MaxSessionTimeout {
		t.Fatalf("SessionTimeout() = %v after asking for 10m, want the granted %v", got, zktest.MaxSessionTimeout)
	}
	lease, err := l.TryAcquire(ctxT(t, 30*time.Second), lock.Request{Keys: []string{testKey("negotiated")}, TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d := lease.Expires.Sub(lease.Acquired); d > zktest.MaxSessionTimeout {
		t.Fatalf("lease valid for %v: want at most the granted session timeout %v", d, zktest.MaxSessionTimeout)
	}
}
