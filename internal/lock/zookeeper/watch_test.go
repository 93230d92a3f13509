package zookeeper

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// recv waits for key on ch.
func recv(t *testing.T, ch <-chan string, key, why string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case k, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the watch channel closed", why)
			}
			if k == key {
				return
			}
		case <-timeout:
			t.Fatalf("%s: no notification for %s", why, key)
		}
	}
}

// TestWatchQueueAndNewKeys: a waiter that leaves the head of a free key's
// queue wakes the watchers (the next waiter may go), a watch on all keys sees
// keys created after it started, and Close ends every watch.
func TestWatchQueueAndNewKeys(t *testing.T) {
	e := sharedServers(t, 1)
	cfg := Config{Servers: e.Addrs(), Root: "/watch"}
	ctx := ctxT(t, 60*time.Second)
	l := newTestLocker(t, cfg)
	w, err := New(cfg, WithOperationTimeout(testOpTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	key := testKey("queue")
	held, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Queue: true}
	second := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Queue: true}
	for _, r := range []lock.Request{first, second} {
		if _, err := l.TryAcquire(ctx, r); err == nil {
			t.Fatal("a queued request took a held key")
		}
	}
	one, err := w.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	all, err := w.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	recv(t, one, key, "release")
	if err := l.Dequeue(ctx, first.Keys, first.Owner); err != nil {
		t.Fatal(err)
	}
	recv(t, one, key, "the head of the queue left")
	recv(t, all, key, "release or dequeue, on the all-keys watch")

	fresh := testKey("new")
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{fresh}, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	recv(t, all, fresh, "release of a key created after Watch")

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan string{one, all} {
		deadline := time.After(20 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			case <-deadline:
				t.Fatal("a watch channel stayed open after Close")
			}
		}
	}
}
