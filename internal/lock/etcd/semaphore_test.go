package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestReleaseWithTheLimitChanged: a lease released with another limit than
// it was acquired with (the lock's maxHolders changed while it held; the
// operator rebuilds the lease from the lock as it is now) is still released,
// as a mutex and as a semaphore; on a session it would otherwise stay held
// for as long as the operator lives. The token still decides: a release
// with another token touches nothing.
func TestReleaseWithTheLimitChanged(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/limit-changed/"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxT(t, time.Minute)
	for _, c := range []struct {
		name          string
		acquired, now int
	}{{"mutex-released-as-semaphore", 1, 3}, {"semaphore-released-as-mutex", 3, 1}} {
		t.Run(c.name, func(t *testing.T) {
			key := c.name
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: c.acquired})
			if err != nil {
				t.Fatal(err)
			}
			rebuilt := &lock.Lease{Keys: lease.Keys, Owner: lease.Owner, Fence: lease.Fence, Limit: c.now}
			wrong := *rebuilt
			wrong.Fence++
			if err := l.Release(ctx, &wrong); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("Release with another token = %v, want ErrNotHeld", err)
			}
			if err := l.Release(ctx, rebuilt); err != nil {
				t.Fatalf("Release with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
			}
			if _, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute}); err != nil {
				t.Fatalf("the key after the release: %v", err)
			}
		})
	}
}
