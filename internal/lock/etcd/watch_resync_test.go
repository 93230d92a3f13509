package etcd

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// waitForKey reads ch until key arrives or d passes.
func waitForKey(t *testing.T, ch <-chan string, key string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case k, ok := <-ch:
			if !ok {
				t.Fatalf("the watch ended before %q was delivered", key)
			}
			if k == key {
				return
			}
		case <-deadline:
			t.Fatalf("%q was not delivered within %v", key, d)
		}
	}
}

// queueBehind makes a holder take key and two owners queue behind it, on l
// (whose waiter TTL outlasts the test); it returns the holder's lease and
// the first waiter's owner token.
func queueBehind(t *testing.T, l *Locker, key string) (*lock.Lease, string) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	held, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	first := ownerToken(t)
	for i, owner := range []string{first, ownerToken(t)} {
		if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "waiter", Owner: owner, Queue: true}); err == nil {
			t.Fatalf("waiter %d took the held key", i)
		}
	}
	return held, first
}

// TestWatchOfEveryKeySeesAHeadWaiterLeave: the operator watches every key;
// when the waiter at the head of a free key's queue leaves, the next waiter
// is now the head and must be woken, as after a release. Before, only
// holder keys were watched and that waiter slept until its next poll.
func TestWatchOfEveryKeySeesAHeadWaiterLeave(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/headleave/"}
	l := newTestLocker(t, cfg, WithWaiterTTL(time.Minute))
	ch, err := newTestLocker(t, cfg).Watch(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	key := "ledger"
	held, first := queueBehind(t, l, key)
	if err := l.Release(ctxT(t, 10*time.Second), held); err != nil {
		t.Fatal(err)
	}
	waitForKey(t, ch, key, 10*time.Second)
	if err := l.Dequeue(ctxT(t, 10*time.Second), []string{key}, first); err != nil {
		t.Fatal(err)
	}
	waitForKey(t, ch, key, 10*time.Second)
}

// TestWatchOfEveryKeyResyncsAfterACompaction: the operator's watch of every
// key is cut off while a waited-for key is released and the revisions are
// compacted; when it comes back it cannot resume from its revision, and must
// deliver the keys that have waiters, since it may have missed their
// release. Before, the watch of every key delivered nothing after a
// compaction, and the waiters slept until their next poll.
func TestWatchOfEveryKeyResyncsAfterACompaction(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/compact/"}
	link := locktest.NewLink(t, m.Addr)
	watcher := newTestLocker(t, Config{Endpoints: []string{link.Addr()}, Prefix: cfg.Prefix})
	ch, err := watcher.Watch(ctxT(t, 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, cfg, WithWaiterTTL(time.Minute))
	key := "ledger"
	held, _ := queueBehind(t, l, key)

	heal := link.Cut()
	if err := l.Release(ctxT(t, 10*time.Second), held); err != nil {
		heal()
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		heal()
		t.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	ctx := ctxT(t, 10*time.Second)
	// A write after the release, so that compacting at its revision
	// removes the release's event from the history.
	resp, err := admin.Put(ctx, "compact-probe", "x")
	if err == nil {
		_, err = admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	}
	heal()
	if err != nil {
		t.Fatalf("compact: %v", err)
	}
	waitForKey(t, ch, key, 30*time.Second)
}

// TestExpiresCountsTheCallOnce: Lease.Expires is the start of the call +
// TTL - drift (docs/safety.md): etcd counts the TTL from its grant, after
// the start, so the time the call took is inside the TTL already. Before,
// the call's duration was subtracted a second time, and over a slow link
// (200ms each way here) the lease ended seconds early for nothing.
func TestExpiresCountsTheCallOnce(t *testing.T) {
	m := etcdtest.Start(t)
	link := locktest.NewLink(t, m.Addr)
	l := newTestLocker(t, Config{Endpoints: []string{link.Addr()}, Prefix: "/expires/"})
	ctx := ctxT(t, 30*time.Second)
	// Connect before slowing the link.
	if _, err := l.Inspect(ctx, []string{"warm-up"}); err != nil {
		t.Fatal(err)
	}
	heal := link.Slow(200*time.Millisecond, 0)
	defer heal()
	ttl := 5 * time.Second
	before := time.Now()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"ledger"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(before)
	if want := before.Add(ttl - drift(ttl)); lease.Expires.Before(want) {
		t.Errorf("acquired in %v: Expires is %v after the start, want at least TTL - drift = %v", took.Round(time.Millisecond), lease.Expires.Sub(before).Round(time.Millisecond), ttl-drift(ttl))
	}
	before = time.Now()
	renewed, err := l.Renew(ctx, lease, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if want := before.Add(ttl - drift(ttl)); renewed.Expires.Before(want) {
		t.Errorf("renewed in %v: Expires is %v after the start, want at least TTL - drift = %v", time.Since(before).Round(time.Millisecond), renewed.Expires.Sub(before).Round(time.Millisecond), ttl-drift(ttl))
	}
}
