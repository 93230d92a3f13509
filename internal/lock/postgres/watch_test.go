package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestWatchAllKeysAfterReconnect: a Watch of every key whose listening
// connection was down while a key with a queued waiter was released gets
// that key once the connection is back (the release's NOTIFY went to no
// one), so that whoever serves the waiter tries again.
func TestWatchAllKeysAfterReconnect(t *testing.T) {
	s := pgtest.Start(t)
	link := locktest.NewLink(t, s.Addr)
	direct := configFor(s)
	watcher := newTestLocker(t, linkConfig(t, s, link))
	holder := newTestLocker(t, direct)
	waiter := newTestLocker(t, direct, WithWaiterTTL(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const key = "watched-after-reconnect"
	lease, err := holder.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	// A queued waiter: its place stays (waiter TTL a minute) when the key
	// is released, until it calls again.
	var held *lock.HeldError
	if _, err := waiter.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "waiter", Owner: "waiter-owner", Queue: true}); !errors.As(err, &held) {
		t.Fatalf("queued TryAcquire of a held key: %v, want a *lock.HeldError", err)
	}
	ch, err := watcher.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The listening connection goes down; the release's NOTIFY reaches no one.
	heal := link.Cut()
	if err := holder.Release(ctx, lease); err != nil {
		heal()
		t.Fatal(err)
	}
	if !waitListening(t, watcher, false, 10*time.Second) {
		heal()
		t.Fatal("the watcher's listening connection did not notice the cut link within 10s")
	}
	heal()
	// It comes back (a reconnect with backoff) ...
	if !waitListening(t, watcher, true, 10*time.Second) {
		t.Fatal("the watcher's listening connection did not come back within 10s after the link healed")
	}
	// ... and delivers the keys that have waiters, since their releases
	// may have been missed.
	const bound = 3 * time.Second
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case k, ok := <-ch:
			if !ok {
				t.Fatal("the Watch channel closed")
			}
			if k == key {
				return
			}
		case <-timer.C:
			t.Fatalf("the all-keys Watch did not deliver %q within %v after its listening connection came back: the release while it was down (a waiter still queued) was missed", key, bound)
		}
	}
}

// waitListening waits until l's listening connection is up (listening) or
// down, as want says, at most d.
func waitListening(t *testing.T, l *Locker, want bool, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l.lis.mu.Lock()
		up := l.lis.up
		l.lis.mu.Unlock()
		if up == want {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
