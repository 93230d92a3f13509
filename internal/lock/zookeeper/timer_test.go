package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// ZooKeeper request opcodes (the request header after the length and xid).
const (
	opExistsReq = 3
	opMultiReq  = 14
)

// holdDial dials with net.Dialer. Once armed (holdAfterMulti) it lets the
// client's requests through until a multi has passed (the acquisition), then
// keeps back the next exists or multi request (the TTL timer's first one)
// until release, while every later request goes on: the timer's goroutine
// stalled after deciding to end the lease. The client matches answers by
// xid, so an answer that comes late is still its request's.
type holdDial struct {
	mu       sync.Mutex
	state    int // 0 off, 1 waiting for a multi to pass, 2 holding the next one, 3 holding
	held     []byte
	heldConn *holdConn
	heldCh   chan struct{}
}

func (d *holdDial) dial(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: c, d: d}, nil
}

// holdAfterMulti arms the hold (see holdDial).
func (d *holdDial) holdAfterMulti() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state, d.held, d.heldConn, d.heldCh = 1, nil, nil, make(chan struct{})
}

// keep tells whether to hold back frame (a complete request packet).
func (d *holdDial) keep(frame []byte, c *holdConn) bool {
	if len(frame) < 12 {
		return false
	}
	op := int32(binary.BigEndian.Uint32(frame[8:12]))
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.state == 1 && op == opMultiReq:
		d.state = 2
	case d.state == 2 && (op == opExistsReq || op == opMultiReq):
		d.state, d.held, d.heldConn = 3, frame, c
		close(d.heldCh)
		return true
	}
	return false
}

// waitHeld waits until a request is held.
func (d *holdDial) waitHeld(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	d.mu.Lock()
	ch := d.heldCh
	d.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal(what)
	}
}

// release sends the held request.
func (d *holdDial) release(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	frame, c := d.held, d.heldConn
	d.state, d.held, d.heldConn = 0, nil, nil
	d.mu.Unlock()
	if c == nil {
		t.Fatal("no request held")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.Conn.Write(frame); err != nil {
		t.Fatalf("send the held request: %v", err)
	}
}

type holdConn struct {
	net.Conn
	d         *holdDial
	wmu       sync.Mutex
	pending   []byte
	handshook bool
}

// Write passes the client's packets on, whole, except the one held.
func (c *holdConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.pending = append(c.pending, p...)
	for len(c.pending) >= 4 {
		n := int(binary.BigEndian.Uint32(c.pending[:4]))
		if len(c.pending) < 4+n {
			break
		}
		frame := append([]byte(nil), c.pending[:4+n]...)
		c.pending = c.pending[4+n:]
		if c.handshook && c.d.keep(frame, c) {
			continue
		}
		c.handshook = true // the first packet is the connect request
		if _, err := c.Conn.Write(frame); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// expireSignal reports every end of a TTL timer's work on l.
func expireSignal(l *Locker) <-chan struct{} {
	ch := make(chan struct{}, 16)
	l.afterExpire = func(string) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return ch
}

func waitSignal(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal(what)
	}
}

// assertHeldBy checks that another owner cannot take key: lease holds it.
func assertHeldBy(t *testing.T, ctx context.Context, other *Locker, key string, lease *lock.Lease) {
	t.Helper()
	got, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "other"})
	if err == nil {
		t.Fatalf("another owner acquired %s (fence %d) while the lease with fence %d holds it (valid until %v, now %v)", key, got.Fence, lease.Fence, lease.Expires.Format(time.StampMilli), time.Now().Format(time.StampMilli))
	}
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Fence != lease.Fence {
		t.Fatalf("TryAcquire of %s by another owner: %v; want it held by the lease with fence %d", key, err, lease.Fence)
	}
}

// waitFree polls until key is free, for at most d.
func waitFree(t *testing.T, ctx context.Context, l *Locker, key string, d time.Duration, what string) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := wait.PollUntilContextCancel(pctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		st, err := l.Inspect(ctx, []string{key})
		return err == nil && !st[0].Held, nil
	})
	if err != nil {
		st, ierr := l.Inspect(ctx, []string{key})
		t.Fatalf("%s: after %v Inspect(%s) = %+v, %v", what, d, key, st, ierr)
	}
}

// stalledTimerSetup returns a test context, a Locker l whose dialer can hold
// back its TTL timer's request (h), the signal of l's timers ending, and a
// second Locker on the same ensemble.
func stalledTimerSetup(t *testing.T) (context.Context, *holdDial, *Locker, <-chan struct{}, *Locker) {
	t.Helper()
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 90*time.Second)
	h := &holdDial{}
	l := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/timers", Dial: h.dial}, WithOperationTimeout(30*time.Second))
	return ctx, h, l, expireSignal(l), newTestLocker(t, Config{Servers: e.Addrs(), Root: "/timers"})
}

// TestOldTimerSparesReacquiredLease: the TTL timer of a lease fires and
// stalls (its first request held back); meanwhile the same owner (the same
// owner token, as the controller uses for the same holder) takes the key
// again. When the stalled timer goes on it must not delete the new holder
// node: another owner cannot acquire the key while the re-acquired lease is
// valid.
func TestOldTimerSparesReacquiredLease(t *testing.T) {
	ctx, h, l, ended, other := stalledTimerSetup(t)
	key := testKey("reacquired")
	req := lock.Request{Keys: []string{key}, TTL: 300 * time.Millisecond, Owner: mustOwner(t), Holder: "job"}
	h.holdAfterMulti()
	first, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	h.waitHeld(t, ctx, "the first lease's TTL timer never sent a request")

	req.TTL = time.Minute
	second, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire again by the same owner: %v", err)
	}
	if second.Fence <= first.Fence {
		t.Fatalf("fence of the re-acquired lease %d, want > %d", second.Fence, first.Fence)
	}
	h.release(t)
	waitSignal(t, ctx, ended, "the first lease's TTL timer never finished")

	assertHeldBy(t, ctx, other, key, second)
	renewed, err := l.Renew(ctx, second, time.Minute)
	if err != nil || renewed.Fence != second.Fence {
		t.Fatalf("Renew of the re-acquired lease: %+v, %v; want fence %d", renewed, err, second.Fence)
	}
	if err := l.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
}

// TestRenewRacingTimerWins: a renewal that commits while the TTL timer is
// ending the lease (its delete held back) wins: the timer deletes only the
// node version it was armed for, so the renewed node stays and no other
// owner can take the key while the renewed lease is valid.
func TestRenewRacingTimerWins(t *testing.T) {
	ctx, h, l, ended, other := stalledTimerSetup(t)
	key := testKey("renew-race")
	h.holdAfterMulti()
	first, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 300 * time.Millisecond, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	h.waitHeld(t, ctx, "the lease's TTL timer never sent a request")

	renewed, err := l.Renew(ctx, first, time.Minute)
	if err != nil {
		t.Fatalf("Renew while the timer stalls: %v", err)
	}
	h.release(t)
	waitSignal(t, ctx, ended, "the lease's TTL timer never finished")

	assertHeldBy(t, ctx, other, key, renewed)
	again, err := l.Renew(ctx, renewed, time.Minute)
	if err != nil || again.Fence != first.Fence {
		t.Fatalf("Renew after the timer: %+v, %v; want fence %d", again, err, first.Fence)
	}
	if err := l.Release(ctx, again); err != nil {
		t.Fatal(err)
	}
}

// TestTimersPerLeaseOfOneOwner: two leases of one owner on different keys
// each end at their own TTL: taking the second does not cancel the first
// one's timer, and the first one's expiry leaves the second alone.
func TestTimersPerLeaseOfOneOwner(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 90*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/timers"}
	l := newTestLocker(t, cfg)
	other := newTestLocker(t, cfg)
	owner := mustOwner(t)
	k1, k2 := testKey("short"), testKey("long")
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{k1}, TTL: 300 * time.Millisecond, Owner: owner, Holder: "job"}); err != nil {
		t.Fatal(err)
	}
	long, err := l.TryAcquire(ctx, lock.Request{Keys: []string{k2}, TTL: time.Minute, Owner: owner, Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	// Its TTL is 300ms; the bound only keeps a failing run short.
	waitFree(t, ctx, other, k1, 20*time.Second, "the owner's first lease did not end at its TTL once the owner took a second lease")
	assertHeldBy(t, ctx, other, k2, long)

	// The second lease's own timer still works.
	if _, err := l.Renew(ctx, long, 300*time.Millisecond); err != nil {
		t.Fatalf("Renew of the second lease: %v", err)
	}
	waitFree(t, ctx, other, k2, 20*time.Second, "the owner's second lease did not end at its TTL")
}

// TestStaleLeaseOfSameOwner: once the owner took the key again (a new fence),
// the earlier lease is gone: renewing or releasing it, from the Locker that
// took both or from another one, reports it lost and leaves the new lease
// alone.
func TestStaleLeaseOfSameOwner(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/timers"}
	l := newTestLocker(t, cfg)
	other := newTestLocker(t, cfg)
	key := testKey("stale")
	req := lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: "job"}
	first, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := l.TryAcquire(ctx, req)
	if err != nil || second.Fence <= first.Fence {
		t.Fatalf("TryAcquire again by the same owner: %+v, %v; want a fence above %d", second, err, first.Fence)
	}
	for _, by := range []*Locker{l, newTestLocker(t, cfg)} {
		if got, err := by.Renew(ctx, stored(first), time.Minute); !errors.Is(err, lock.ErrLost) {
			if got != nil {
				t.Fatalf("Renew of the replaced lease (fence %d): renewed with fence %d until %v; want ErrLost", first.Fence, got.Fence, got.Expires.Format(time.StampMilli))
			}
			t.Fatalf("Renew of the replaced lease (fence %d): %v; want ErrLost", first.Fence, err)
		}
		assertHeldBy(t, ctx, other, key, second)
		if err := by.Release(ctx, stored(first)); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("Release of the replaced lease (fence %d): %v; want ErrNotHeld", first.Fence, err)
		}
		assertHeldBy(t, ctx, other, key, second)
	}
	if err := l.Release(ctx, second); err != nil {
		t.Fatal(err)
	}
}

// TestUnconfirmedTimer: the timer armed for an acquisition whose answer was
// lost ends the holder node that acquisition would have created, and only
// that one: not a node at another version, nor one that an acquisition with a
// known outcome (its own timer) holds.
func TestUnconfirmedTimer(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/timers"}
	l := newTestLocker(t, cfg)
	ended := expireSignal(l)
	other := newTestLocker(t, cfg)
	key := testKey("unconfirmed")
	owner := mustOwner(t)
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: owner, Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := l.lastWritten(lease.Fence, ownerHash(owner), lease.Keys)
	if nodes == nil {
		t.Fatal("no timer for the lease")
	}
	hash, v := ownerHash(owner), nodes[0].keyVersion
	soon := time.Now().Add(100 * time.Millisecond)

	// A version the acquisition did not leave, and the node its own timer
	// ends: both left alone.
	l.armUnconfirmed(hash, lease.Keys, soon, []int32{v + 1}, holderName)
	waitSignal(t, ctx, ended, "the timer never ran")
	l.armUnconfirmed(hash, lease.Keys, soon, []int32{v}, holderName)
	waitSignal(t, ctx, ended, "the timer never ran")
	assertHeldBy(t, ctx, other, key, lease)

	// Without a known acquisition holding it, the node is the one the lost
	// acquisition created: ended.
	l.disarmTimer(lease.Fence, hash)
	l.armUnconfirmed(hash, lease.Keys, time.Now().Add(100*time.Millisecond), []int32{v}, holderName)
	waitSignal(t, ctx, ended, "the timer never ran")
	st, err := other.Inspect(ctx, []string{key})
	if err != nil || st[0].Held {
		t.Fatalf("Inspect after the unconfirmed timer: %+v, %v; want free", st, err)
	}
}
