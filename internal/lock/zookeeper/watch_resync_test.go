package zookeeper

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// TestWatchAllResyncsAfterReconnect: after the connection of an all-keys
// watch is cut and the client reconnects (the session re-established), the
// watch delivers the keys that have waiters, since releases may have been
// missed while it was away, even when its watch events say nothing changed.
func TestWatchAllResyncsAfterReconnect(t *testing.T) {
	e := sharedServers(t, 1)
	root := "/watch-resync-" + time.Now().Format("150405.000000")
	cfg := Config{Servers: e.Addrs(), Root: root}
	ctx := ctxT(t, 60*time.Second)
	l := newTestLocker(t, cfg)
	key := testKey("resync")
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Queue: true}); err == nil {
		t.Fatal("a queued request took a held key")
	}
	link := locktest.NewLink(t, e.Addrs()[0])
	w := newTestLocker(t, Config{Servers: []string{link.Addr()}, Root: root})
	all, err := w.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heal := link.Cut()
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return w.conn.State() != zk.StateHasSession, nil
	})
	heal()
	if err != nil {
		t.Fatalf("the watcher never noticed the cut: %v", err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case k := <-all:
			if k == key {
				return
			}
		case <-timeout:
			t.Fatalf("no notification for %s (held, with a waiter) within 10s of the reconnection: the all-keys watch did not resync", key)
		}
	}
}
