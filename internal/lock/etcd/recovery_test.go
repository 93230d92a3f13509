package etcd

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ownerToken(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// stored is what the operator keeps of a lease across its restarts.
func stored(l *lock.Lease) *lock.Lease {
	return &lock.Lease{Keys: l.Keys, Owner: l.Owner, Holder: l.Holder, Fence: l.Fence, TTL: l.TTL}
}

// TestRecoveryByNewLocker: a Locker of a new process renews (same and other
// TTL) and releases a lease an older, closed Locker acquired, from the
// fields the operator stores; the same owner acquiring again succeeds; an
// expired lease is lost.
func TestRecoveryByNewLocker(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/recovery/"}
	ctx := ctxT(t, time.Minute)
	keys := []string{"ns/a/job", "ns/a/db"}

	old := newTestLocker(t, cfg)
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 10 * time.Second, Owner: ownerToken(t), Holder: "old-process"})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	l := newTestLocker(t, cfg)
	renewed, err := l.Renew(ctx, stored(lease), 10*time.Second)
	if err != nil {
		t.Fatalf("Renew by a new Locker: %v", err)
	}
	if renewed.Fence != lease.Fence || renewed.Expires.IsZero() || renewed.Acquired.IsZero() {
		t.Fatalf("Renew = %+v, want fence %d and Expires set", renewed, lease.Fence)
	}
	// Another TTL moves the keys to a new etcd lease with the same token.
	renewed, err = l.Renew(ctx, stored(lease), 3*time.Second)
	if err != nil || renewed.Fence != lease.Fence || renewed.TTL != 3*time.Second {
		t.Fatalf("Renew with another TTL = %+v, %v; want fence %d", renewed, err, lease.Fence)
	}
	st, err := l.Inspect(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Held || s.Fence != lease.Fence || s.Holder != "old-process" || time.Until(s.Expires) > 4*time.Second {
			t.Fatalf("after Renew with a 3s TTL Inspect = %+v, want held by old-process, fence %d, expiring within 3s", s, lease.Fence)
		}
	}
	// The same owner acquiring again (an operator that lost track) succeeds.
	again, err := l.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 10 * time.Second, Owner: lease.Owner, Holder: "old-process"})
	if err != nil || again.Fence < lease.Fence {
		t.Fatalf("TryAcquire by the holding owner = %+v, %v; want success with a fence >= %d", again, err, lease.Fence)
	}
	if err := newTestLocker(t, cfg).Release(ctx, stored(again)); err != nil {
		t.Fatalf("Release by yet another Locker: %v", err)
	}
	if err := l.Release(ctx, stored(again)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if _, err := l.Renew(ctx, stored(again), time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after Release = %v, want ErrLost", err)
	}

	// Expired: not renewable by a new Locker either.
	short, err := l.TryAcquire(ctx, lock.Request{Keys: keys[:1], TTL: time.Second, Owner: ownerToken(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := l.Inspect(ctx, keys[:1])
		return err == nil && !st[0].Held, nil
	})
	if err != nil {
		t.Fatalf("the 1s lease did not expire: %v", err)
	}
	if _, err := newTestLocker(t, cfg).Renew(ctx, stored(short), time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of an expired lease by a new Locker = %v, want ErrLost", err)
	}
	if err := newTestLocker(t, cfg).Release(ctx, stored(short)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an expired lease by a new Locker = %v, want ErrNotHeld", err)
	}
}

// countingDialer records every connection the client opens.
type countingDialer struct {
	mu    sync.Mutex
	addrs []string
	calls atomic.Int64
}

func (d *countingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.calls.Add(1)
	d.mu.Lock()
	d.addrs = append(d.addrs, network+" "+addr)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// TestDialIsUsedForEveryConnection: with Config.Dial every connection goes
// through it (a refusing dialer makes every operation fail), also on every
// member of a cluster and after a member restarts.
func TestDialIsUsedForEveryConnection(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx := ctxT(t, 2*time.Minute)

	var refused atomic.Int64
	refuse := func(context.Context, string, string) (net.Conn, error) {
		refused.Add(1)
		return nil, errors.New("refused by policy")
	}
	cfg := configFor(c)
	cfg.Dial = refuse
	bad := newTestLocker(t, cfg, WithOpTimeout(time.Second), WithDialTimeout(time.Second))
	if err := bad.Ping(ctx); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Ping through a refusing dialer = %v, want ErrBackendUnavailable", err)
	}
	var ne *lock.NodeError
	_, err := bad.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Second})
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.As(err, &ne) || !strings.Contains(ne.Node, c.Members[0].Addr) {
		t.Fatalf("TryAcquire through a refusing dialer = %v, want ErrBackendUnavailable with a NodeError naming the endpoints", err)
	}
	if _, err := bad.Watch(ctx, "k"); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Watch through a refusing dialer = %v, want ErrBackendUnavailable", err)
	}
	if refused.Load() == 0 {
		t.Fatal("the refusing dialer was never called")
	}

	var d countingDialer
	cfg.Dial = d.dial
	l := newTestLocker(t, cfg)
	lease, err := l.Acquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d.calls.Load() == 0 {
		t.Fatal("the dialer was not called for the client's connection")
	}
	// Kill the member the client uses: it must reconnect, through the dialer.
	before := d.calls.Load()
	for _, m := range c.Members {
		m.Kill()
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(time.Minute); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.Renew(ctx, lease, 5*time.Second)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("Renew after every member restarted: %v", err)
	}
	if d.calls.Load() <= before {
		t.Fatalf("after every member restarted the client reconnected without the dialer (%d calls before, %d after)", before, d.calls.Load())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	eps := strings.Join(c.Endpoints(), " ")
	for _, a := range d.addrs {
		network, addr, _ := strings.Cut(a, " ")
		if network != "tcp" || !strings.Contains(eps, addr) {
			t.Errorf("dialed %q, want tcp to one of %s", a, eps)
		}
	}
}

// TestFencePastMaxIsRefused: a revision outside (0, lock.MaxFence) is never
// handed out as a token (etcd revisions cannot be set, so this checks the
// guard on a transaction reply).
func TestFencePastMaxIsRefused(t *testing.T) {
	l := &Locker{opts: options{Options: lock.DefaultOptions()}}
	req := lock.Request{Keys: []string{"k"}, TTL: time.Minute}
	s := &session{id: 1, ttl: 60, refreshed: time.Now()}
	for _, rev := range []int64{0, lock.MaxFence, lock.MaxFence + 1} {
		if lease, err := l.acquired(req, &clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: rev}}, time.Now(), s); err == nil {
			t.Errorf("revision %d became the lease %+v, want an error", rev, lease)
		}
	}
	if lease, err := l.acquired(req, &clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: lock.MaxFence - 1}}, time.Now(), s); err != nil || lease.Fence != lock.MaxFence-1 {
		t.Errorf("revision MaxFence-1: %+v, %v", lease, err)
	}
}
