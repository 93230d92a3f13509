package etcd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// TestAcquireIsEventDriven: a blocked Acquire whose fallback polling and
// queue heartbeat are ten minutes away still returns (within the test's one
// minute) once the holder releases or its lease expires: only the etcd watch
// can have woken it.
func TestAcquireIsEventDriven(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/events/"}
	holder := newTestLocker(t, cfg)
	for _, tc := range []struct {
		name   string
		queue  bool
		expire bool
	}{
		{"release", false, false},
		{"release queued", true, false},
		{"expiry", false, true},
		{"expiry queued", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "event/" + strings.ReplaceAll(tc.name, " ", "-")
			waiting := make(chan struct{}, 1)
			sink := funcr.New(func(_, args string) {
				if strings.Contains(args, "Waiting for lease") {
					select {
					case waiting <- struct{}{}:
					default:
					}
				}
			}, funcr.Options{Verbosity: 4})
			waiter := newTestLocker(t, cfg,
				WithBackoff(wait.Backoff{Duration: 10 * time.Minute, Factor: 1}),
				WithWaiterTTL(30*time.Minute),
				WithLogger(sink))
			ttl := 30 * time.Second
			if tc.expire {
				ttl = time.Second
			}
			h, err := holder.TryAcquire(ctxT(t, 20*time.Second), lock.Request{Keys: []string{key}, TTL: ttl, Holder: "holder"})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				lease, err := waiter.Acquire(ctxT(t, time.Minute), lock.Request{Keys: []string{key}, TTL: 10 * time.Second, Queue: tc.queue})
				if err == nil && lease.Fence <= h.Fence {
					err = fmt.Errorf("fence %d after %d", lease.Fence, h.Fence)
				}
				done <- err
			}()
			select {
			case <-waiting:
			case err := <-done:
				t.Fatalf("Acquire returned while the key was held: %v", err)
			}
			if !tc.expire {
				if err := holder.Release(ctxT(t, 20*time.Second), h); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("Acquire after the holder went away: %v (the fallback polling is ten minutes away: the watch did not wake it)", err)
			}
		})
	}
}

// TestWatchSurvivesMemberRestarts: a Watch keeps delivering releases after
// every member (the leader among them) was killed and restarted, and a
// release made while the watch was broken is delivered once it is back.
func TestWatchSurvivesMemberRestarts(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cfg := configFor(c)
	cfg.Prefix = "/watch-restarts/"
	w := newTestLocker(t, cfg)
	l := newTestLocker(t, cfg)
	ctx := ctxT(t, 2*time.Minute)
	ch, err := w.Watch(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	release := func(key string) {
		t.Helper()
		var lease *lock.Lease
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			var err error
			lease, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return l.Release(ctx, lease) == nil, nil
		})
		if err != nil {
			t.Fatalf("release %s: %v", key, err)
		}
	}
	expect := func(key string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != key {
				t.Fatalf("Watch delivered %q, want %q", got, key)
			}
		case <-ctx.Done():
			t.Fatalf("Watch delivered nothing for %q", key)
		}
	}
	release("a")
	expect("a")
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	release("b") // on the remaining majority, while the watcher may be cut off
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members {
		if m == leader {
			continue
		}
		m.Kill()
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(time.Minute); err != nil {
		t.Fatal(err)
	}
	expect("b")
	release("a")
	expect("a")
}
