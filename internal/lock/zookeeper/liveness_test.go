package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// waitEnsemblePast waits until the ensemble's clock (the mtime of a write to
// the ticket node) is past t0.
func waitEnsemblePast(ctx context.Context, t *testing.T, l *Locker, raw *zk.Conn, t0 time.Time) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		s, err := raw.Set(l.ticketPath, nil, -1)
		return err == nil && time.UnixMilli(s.Mtime).After(t0), nil
	})
	if err != nil {
		t.Fatalf("waiting for the ensemble's clock to pass %v: %v", t0, err)
	}
}

// TestAcquirerTakesHolderPastTTL: a holder node whose TTL passed on the
// ensemble's clock while the Locker that would end it is gone (Close keeps
// the session, and the timer with it is gone) is free for an acquirer long
// before the session times out.
func TestAcquirerTakesHolderPastTTL(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/liveness"}
	ctx := ctxT(t, 60*time.Second)
	key := testKey("stale")
	old := newTestLocker(t, cfg) // session timeout 10s
	lease, err := old.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 500 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	b := newTestLocker(t, cfg)
	raw := rawConn(t, e.Addrs())
	waitEnsemblePast(ctx, t, b, raw, lease.Acquired.Add(lease.TTL+time.Second))
	// Well within the old session's 10s timeout.
	got, err := b.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: mustOwner(t)})
	if err != nil {
		t.Fatalf("TryAcquire of a key whose holder is past its TTL on the ensemble's clock: %v; want the key (the holder is gone)", err)
	}
	if got.Fence <= lease.Fence {
		t.Fatalf("fence %d after the stale lease's %d", got.Fence, lease.Fence)
	}
	// The stale lease cannot come back.
	if _, err := b.Renew(ctx, stored(lease), 5*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the taken-over lease: %v, want ErrLost", err)
	}
}

// TestRenewPastTTLDoesNotRevive: a lease whose timer could not end it in
// time (here: stopped, as when the ensemble was unreachable) is not revived
// by a renewal from its own Locker once its TTL passed on the ensemble's
// clock: the renewal reports ErrLost.
func TestRenewPastTTLDoesNotRevive(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/liveness"}
	ctx := ctxT(t, 60*time.Second)
	l := newTestLocker(t, cfg)
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{testKey("revive")}, TTL: 300 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The timer gives up (as the old one did after a session timeout).
	l.timersMu.Lock()
	for id, lt := range l.timers {
		lt.timer()
		delete(l.timers, id)
	}
	l.timersMu.Unlock()
	waitEnsemblePast(ctx, t, l, rawConn(t, e.Addrs()), lease.Acquired.Add(lease.TTL+200*time.Millisecond))
	if _, err := l.Renew(ctx, lease, 5*time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew past the TTL of a lease its timer did not end: %v; want ErrLost (not revived)", err)
	}
}

// TestQuorumLossPastSessionTimeoutFreesKey: two of three servers paused for
// longer than the session timeout and the TTL; afterwards the unrenewed key
// is free again (its timer keeps trying, and acquirers take a holder past its
// TTL), without restarting the Locker that held it.
func TestQuorumLossPastSessionTimeoutFreesKey(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	// 3s: past it the old timer gave up; the holder has as long to reconnect
	// after the quorum is back before its session would expire (which would
	// free the key without any fix).
	cfg := Config{Servers: e.Addrs(), Root: "/liveness", SessionTimeout: 3 * time.Second}
	ctx := ctxT(t, 90*time.Second)
	key := testKey("quorum")
	holder := newTestLocker(t, cfg, WithOperationTimeout(time.Second))
	lease, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 500 * time.Millisecond, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	paused := e.Servers[:2]
	for _, s := range paused {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if resumed {
			return
		}
		resumed = true
		for _, s := range paused {
			if err := s.Resume(); err != nil {
				t.Errorf("resume server %d: %v", s.ID, err)
			}
		}
	}
	t.Cleanup(resume)
	// Past the session timeout (the old timer gave up after one) and the TTL.
	lossEnds := time.Now().Add(holder.SessionTimeout() + time.Second)
	<-time.After(time.Until(lossEnds))
	resume()
	if err := e.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	session := holder.conn.SessionID()
	defer func() {
		if now := holder.conn.SessionID(); now != session {
			t.Logf("the holder's session changed (%x to %x): it expired after all", session, now)
		}
	}()
	other := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/liveness"})
	// The holder's session survives the quorum loss (the new leader gives
	// every session a new timeout), so only the TTL can free the key.
	deadline := time.Now().Add(8 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		got, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: mustOwner(t)})
		if err == nil {
			if got.Fence <= lease.Fence {
				t.Fatalf("fence %d after %d", got.Fence, lease.Fence)
			}
			return
		}
		last = err
		<-time.After(100 * time.Millisecond)
	}
	t.Fatalf("the key is still held 8s after a quorum loss that outlasted the session timeout and the TTL: %v", last)
}

// TestQueuedWaitersKeepOrderAcrossRestart: waiters queued through one
// Locker (an operator) keep their FIFO order when a new Locker (the
// restarted operator, a new session) refreshes them, also after the old
// session timed out, and in whatever order the new Locker refreshes them.
func TestQueuedWaitersKeepOrderAcrossRestart(t *testing.T) {
	e := sharedServers(t, 3)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/liveness"}
	ctx := ctxT(t, 60*time.Second)
	key := testKey("order")
	// Long enough for the restart (Close takes up to a second) between two
	// refreshes: a waiter not refreshed within it is rightly dropped.
	wttl := WithWaiterTTL(5 * time.Second)
	blocker := newTestLocker(t, cfg, wttl)
	held, err := blocker.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	oldCfg := cfg
	oldCfg.SessionTimeout = 2 * time.Second
	op1 := newTestLocker(t, oldCfg, wttl)
	first, second := mustOwner(t), mustOwner(t)
	queue := func(l *Locker, owner string) error {
		_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: owner, Queue: true})
		var he *lock.HeldError
		if !errors.As(err, &he) {
			return fmt.Errorf("queued TryAcquire: %w, want a HeldError", err)
		}
		return nil
	}
	for _, o := range []string{first, second} {
		if err := queue(op1, o); err != nil {
			t.Fatal(err)
		}
	}
	// A node of op1's session, to tell when that session timed out.
	sentinel := testKey("session")
	if _, err := op1.TryAcquire(ctx, lock.Request{Keys: []string{sentinel}, TTL: time.Minute, Owner: mustOwner(t)}); err != nil {
		t.Fatal(err)
	}
	if err := op1.Close(); err != nil {
		t.Fatal(err)
	}
	op2 := newTestLocker(t, cfg, wttl)
	// The restarted operator refreshes the waiters (in the other order)
	// until op1's session is gone (its ephemeral nodes with it), and once
	// more.
	raw := rawConn(t, e.Addrs())
	var gone time.Time
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, o := range []string{second, first} {
			if err := queue(op2, o); err != nil {
				return false, err
			}
		}
		if gone.IsZero() {
			if ok, _, err := raw.Exists(op2.holderPath(sentinel)); err == nil && !ok {
				gone = time.Now()
			}
			return false, nil
		}
		return true, nil // refreshed once more after op1's session (and its nodes) ended
	})
	if err != nil {
		t.Fatalf("refreshing the waiters until the old session timed out: %v", err)
	}
	if err := blocker.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	if _, err := op2.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: second, Queue: true}); err == nil {
		t.Fatalf("the second waiter took the key ahead of the first after the operator restart: the queue lost its FIFO order")
	}
	if _, err := op2.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: first, Queue: true}); err != nil {
		t.Fatalf("the first waiter after the operator restart: %v, want the key", err)
	}
}
