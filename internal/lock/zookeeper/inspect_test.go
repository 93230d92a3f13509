package zookeeper

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestInspectCountsLiveWaitersOnly: a waiter that stopped calling is neither
// counted in Queued nor listed once its waiter TTL has passed on the
// ensemble's clock, although its node stays until an acquisition prunes it;
// the holder still is.
func TestInspectCountsLiveWaitersOnly(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/inspect-live"}
	l := newTestLocker(t, cfg) // waiter TTL 1s
	ctx := ctxT(t, 30*time.Second)
	key := fmt.Sprintf("live.%d", time.Now().UnixNano())
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 20 * time.Second, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"first", "second"} {
		o, _ := lock.NewOwnerToken()
		if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 20 * time.Second, Holder: name, Owner: o, Queue: true}); err == nil {
			t.Fatalf("%s acquired a held key", name)
		}
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Queued != 2 || len(st[0].Waiters) != 2 || st[0].HolderCount != 1 {
		t.Fatalf("Inspect = %+v, want 1 holder and 2 waiters", st[0])
	}
	// Nobody refreshes or acquires: once the waiter TTL has passed, both
	// waiters are dead by the ensemble's clock, and Inspect stops counting
	// them while their nodes are still there.
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		st, err = l.Inspect(ctx, []string{key})
		return err == nil && st[0].Queued == 0, nil
	})
	if err != nil {
		t.Fatalf("Inspect still counts waiters that stopped calling: %+v (%v)", st, err)
	}
	if len(st[0].Waiters) != 0 || !st[0].Held || st[0].HolderCount != 1 {
		t.Fatalf("Inspect = %+v, want the holder and no waiters listed", st[0])
	}
	children, _, err := rawConn(t, e.Addrs()).Children(l.keyPath(key))
	if err != nil {
		t.Fatal(err)
	}
	waiters := 0
	for _, c := range children {
		if strings.HasPrefix(c, waiterPrefix) {
			waiters++
		}
	}
	if waiters != 2 {
		t.Fatalf("children %v: want the 2 dead waiter nodes still there (nobody pruned them)", children)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}
