package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

func mustOwner(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func testKey(name string) string { return fmt.Sprintf("ns/team/%s-%d", name, time.Now().UnixNano()) }

// stored is what the operator keeps of a lease across a restart.
func stored(l *lock.Lease) *lock.Lease {
	return &lock.Lease{Keys: l.Keys, Owner: l.Owner, Holder: l.Holder, Fence: l.Fence, TTL: l.TTL}
}

// TestRecoveryByNewLocker: a lease acquired by a Locker that went away (an
// operator restart: Close keeps the session and its nodes) is renewed by a
// new Locker from the stored fields, with the same fencing token, moved into
// the new session, and released by yet another Locker.
func TestRecoveryByNewLocker(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/recovery"}
	ctx := ctxT(t, 60*time.Second)
	keys := []string{testKey("a"), testKey("b")}
	old := newTestLocker(t, cfg)
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	fresh := newTestLocker(t, cfg)
	renewed, err := fresh.Renew(ctx, stored(lease), 30*time.Second)
	if err != nil {
		t.Fatalf("Renew by a new Locker: %v", err)
	}
	if renewed.Fence != lease.Fence || renewed.Expires.IsZero() {
		t.Fatalf("renewed lease %+v: want fence %d and an expiry", renewed, lease.Fence)
	}
	raw := rawConn(t, e.Addrs())
	for _, k := range keys {
		_, st, err := raw.Exists(fresh.holderPath(k))
		if err != nil || st.EphemeralOwner != fresh.conn.SessionID() {
			t.Fatalf("holder node of %s: owner session %#x, %v; want the new Locker's %#x", k, st.EphemeralOwner, err, fresh.conn.SessionID())
		}
	}
	states, err := fresh.Inspect(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if !st.Held || st.Holder != "job" || st.Fence != lease.Fence {
			t.Fatalf("Inspect after the move = %+v, want held by job with fence %d", st, lease.Fence)
		}
	}
	// Renewing again in the same session keeps the token too.
	if again, err := fresh.Renew(ctx, renewed, 30*time.Second); err != nil || again.Fence != lease.Fence {
		t.Fatalf("second Renew: %+v, %v", again, err)
	}

	third := newTestLocker(t, cfg)
	if err := third.Release(ctx, stored(lease)); err != nil {
		t.Fatalf("Release by a third Locker: %v", err)
	}
	if err := third.Release(ctx, stored(lease)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if _, err := fresh.Renew(ctx, renewed, 30*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after the release: %v, want ErrLost", err)
	}
	states, err = third.Inspect(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states {
		if st.Held || st.Fence != lease.Fence {
			t.Fatalf("Inspect after the release = %+v, want free with the last fence %d", st, lease.Fence)
		}
	}
	next, err := third.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second})
	if err != nil || next.Fence <= lease.Fence {
		t.Fatalf("TryAcquire after the release: %+v, %v; want a fence above %d", next, err, lease.Fence)
	}
	if err := third.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
}

// TestMovedLeaseOutlivesOldTimer: when the Locker that acquired a lease is
// still running, its TTL timer must not end the lease that a new Locker
// renewed (moved into its session).
func TestMovedLeaseOutlivesOldTimer(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/recovery"}
	ctx := ctxT(t, 60*time.Second)
	key := testKey("moved")
	old := newTestLocker(t, cfg)
	fired := make(chan struct{})
	var once sync.Once
	old.afterExpire = func(string) { once.Do(func() { close(fired) }) }
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Second, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	fresh := newTestLocker(t, cfg)
	if _, err := fresh.Renew(ctx, stored(lease), 30*time.Second); err != nil {
		t.Fatalf("Renew by a new Locker: %v", err)
	}
	select {
	case <-fired:
	case <-ctx.Done():
		t.Fatal("the old Locker's TTL timer never ran")
	}
	states, err := fresh.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if !states[0].Held || states[0].Fence != lease.Fence {
		t.Fatalf("after the old Locker's timer: %+v, want still held with fence %d", states[0], lease.Fence)
	}
	if err := fresh.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestRecoveryOfEndedLease: a lease whose TTL passed (its Locker still
// running) or that another owner took is lost for a new Locker too.
func TestRecoveryOfEndedLease(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/recovery"}
	ctx := ctxT(t, 60*time.Second)
	key := testKey("ended")
	old := newTestLocker(t, cfg)
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 300 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	other := newTestLocker(t, cfg)
	var next *lock.Lease
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		next, err = other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Holder: "other"})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the key never became free after the TTL: %v", err)
	}
	fresh := newTestLocker(t, cfg)
	if _, err := fresh.Renew(ctx, stored(lease), 30*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of an ended lease: %v, want ErrLost", err)
	}
	if err := fresh.Release(ctx, stored(lease)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an ended lease: %v, want ErrNotHeld", err)
	}
	st, err := fresh.Inspect(ctx, []string{key})
	if err != nil || !st[0].Held || st[0].Holder != "other" || st[0].Fence != next.Fence {
		t.Fatalf("Inspect = %+v, %v; want still held by other with fence %d", st, err, next.Fence)
	}
}

// gateDial dials through net.Dialer while open; while closed it refuses,
// and close cuts the connections it made: a client cut off from the ensemble.
type gateDial struct {
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (g *gateDial) dial(ctx context.Context, network, address string) (net.Conn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errors.New("cut off")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err == nil {
		g.conns = append(g.conns, c)
	}
	return c, err
}

func (g *gateDial) set(closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = closed
	if closed {
		for _, c := range g.conns {
			_ = c.Close()
		}
		g.conns = nil
	}
}

// TestSessionExpiryLosesLeases: a client cut off longer than its session
// timeout loses its leases: the ensemble frees the keys (whatever the lease
// TTL), Lease.Expires never promised more than the session timeout, and
// Renew after the reconnection reports ErrLost.
func TestSessionExpiryLosesLeases(t *testing.T) {
	e := sharedServers(t, 1)
	ctx := ctxT(t, 90*time.Second)
	g := &gateDial{}
	cfg := Config{Servers: e.Addrs(), Root: "/expiry", SessionTimeout: 2 * time.Second, Dial: g.dial}
	l := newTestLocker(t, cfg)
	key := testKey("expiry")
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d := lease.Expires.Sub(lease.Acquired); d > l.SessionTimeout() {
		t.Fatalf("lease valid for %v with a %v session: want no more than the session timeout", d, l.SessionTimeout())
	}
	g.set(true)
	other := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/expiry"})
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		le, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute})
		if err != nil {
			return false, nil
		}
		return true, other.Release(ctx, le)
	})
	if err != nil {
		t.Fatalf("the key of a cut-off client never became free: %v", err)
	}
	g.set(false)
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := l.Renew(ctx, lease, time.Minute)
		if errors.Is(err, lock.ErrBackendUnavailable) {
			return false, nil // still reconnecting
		}
		if !errors.Is(err, lock.ErrLost) {
			return false, fmt.Errorf("Renew after the session expired: %w, want ErrLost", err)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRenewBackAndForth: two running Lockers renewing the same lease (the
// owner token) move it between their sessions; each notices that the nodes it
// wrote were moved and reads again, and the token never changes.
func TestRenewBackAndForth(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/recovery"}
	ctx := ctxT(t, 60*time.Second)
	keys := []string{testKey("x"), testKey("y")}
	a, b := newTestLocker(t, cfg), newTestLocker(t, cfg)
	lease, err := a.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, e.Addrs())
	for i, l := range []*Locker{b, a, a, b, b, a} {
		renewed, err := l.Renew(ctx, stored(lease), 30*time.Second)
		if err != nil || renewed.Fence != lease.Fence {
			t.Fatalf("renewal %d: %+v, %v; want fence %d", i, renewed, err, lease.Fence)
		}
		st, err := l.Inspect(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		for j, s := range st {
			if !s.Held || s.Fence != lease.Fence || s.Holder != "job" {
				t.Fatalf("renewal %d: Inspect = %+v, want held by job with fence %d", i, s, lease.Fence)
			}
			_, hs, err := raw.Exists(l.holderPath(keys[j]))
			if err != nil || hs.EphemeralOwner != l.conn.SessionID() {
				t.Fatalf("renewal %d: holder node of %s in session %#x, %v; want the renewing Locker's %#x", i, keys[j], hs.EphemeralOwner, err, l.conn.SessionID())
			}
		}
	}
	if err := b.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	st, err := b.Inspect(ctx, keys)
	if err != nil || st[0].Held || st[0].Fence != lease.Fence {
		t.Fatalf("after release: %+v, %v; want free with the last fence %d", st, err, lease.Fence)
	}
}

// TestRecoveryAfterTTLIsLost: a lease whose Locker went away (and its TTL
// timer with it) ends at its TTL for a new Locker too, even while the old
// session has not timed out yet: the recovery renewal reports ErrLost and
// frees the keys instead of reviving the lease.
func TestRecoveryAfterTTLIsLost(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/recovery"}
	ctx := ctxT(t, 60*time.Second)
	key := testKey("late")
	old := newTestLocker(t, cfg)
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 300 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	fresh := newTestLocker(t, cfg)
	st, err := fresh.Inspect(ctx, []string{key})
	if err != nil || !st[0].Held {
		t.Fatalf("Inspect after the old Locker closed: %+v, %v; want still held (the session lives)", st, err)
	}
	// Wait until the ensemble's clock is past the lease's end.
	raw := rawConn(t, e.Addrs())
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		s, err := raw.Set(fresh.ticketPath, nil, -1)
		return err == nil && time.UnixMilli(s.Mtime).After(st[0].Expires), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Renew(ctx, stored(lease), 30*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after the TTL: %v, want ErrLost", err)
	}
	st, err = fresh.Inspect(ctx, []string{key})
	if err != nil || st[0].Held {
		t.Fatalf("Inspect after the late renewal: %+v, %v; want free", st, err)
	}

	// The same for a Release after the TTL: the keys are freed, and the
	// caller learns that the lease had ended.
	key2 := testKey("late-release")
	old2 := newTestLocker(t, cfg)
	lease2, err := old2.TryAcquire(ctx, lock.Request{Keys: []string{key2}, TTL: 300 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := old2.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = fresh.Inspect(ctx, []string{key2})
	if err != nil || !st[0].Held {
		t.Fatalf("Inspect after the old Locker closed: %+v, %v; want still held", st, err)
	}
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		s, err := raw.Set(fresh.ticketPath, nil, -1)
		return err == nil && time.UnixMilli(s.Mtime).After(st[0].Expires), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Release(ctx, stored(lease2)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release after the TTL: %v, want ErrNotHeld", err)
	}
	st, err = fresh.Inspect(ctx, []string{key2})
	if err != nil || st[0].Held {
		t.Fatalf("Inspect after the late release: %+v, %v; want free", st, err)
	}
}
