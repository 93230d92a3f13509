package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestRecoveryByNewLocker: a new Locker (a restarted operator: new process,
// new connections) renews and releases a lease an old one acquired, from
// only the fields the operator stores; an expired one is lost.
func TestRecoveryByNewLocker(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	ctx := ctxFor(t, time.Minute)
	owner, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"ns/default/recover-a", "global/recover-b"}
	old := newTestLocker(t, cfg)
	first, err := old.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second, Owner: owner, Holder: "op-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	stored := &lock.Lease{Keys: keys, Owner: owner, Holder: "op-1", Fence: first.Fence, TTL: 30 * time.Second}
	fresh := newTestLocker(t, cfg)
	renewed, err := fresh.Renew(ctx, stored, 30*time.Second)
	if err != nil {
		t.Fatalf("Renew by a new Locker: %v", err)
	}
	if renewed.Fence != first.Fence || renewed.Expires.IsZero() {
		t.Fatalf("renewed lease %+v: want fence %d and an expiry", renewed, first.Fence)
	}
	again, err := fresh.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second, Owner: owner, Holder: "op-1"})
	if err != nil {
		t.Fatalf("TryAcquire by the owner that holds the keys: %v", err)
	}
	if again.Fence <= first.Fence {
		t.Fatalf("fence of the re-acquisition %d, want > %d", again.Fence, first.Fence)
	}
	other := newTestLocker(t, cfg)
	if _, err := other.TryAcquire(ctx, lock.Request{Keys: keys[1:], TTL: time.Second}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another owner took a recovered key: %v", err)
	}
	// The re-acquisition replaced the stored lease: that one no longer
	// releases anything; the new one does.
	if err := fresh.Release(ctx, stored); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the replaced lease: %v, want ErrNotHeld", err)
	}
	if err := fresh.Release(ctx, again); err != nil {
		t.Fatalf("Release by a new Locker: %v", err)
	}
	if err := fresh.Release(ctx, again); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if _, err := fresh.Renew(ctx, again, time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew after Release: %v, want ErrLost", err)
	}

	// A lease that expired while its operator was away is lost.
	short, err := other.TryAcquire(ctx, lock.Request{Keys: keys[:1], TTL: 200 * time.Millisecond, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	waitFree(t, other, keys[0])
	gone := &lock.Lease{Keys: short.Keys, Owner: owner, Fence: short.Fence, TTL: short.TTL}
	if _, err := newTestLocker(t, cfg).Renew(ctx, gone, time.Second); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of an expired lease by a new Locker: %v, want ErrLost", err)
	}
	if err := newTestLocker(t, cfg).Release(ctx, gone); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of an expired lease by a new Locker: %v, want ErrNotHeld", err)
	}
}

func waitFree(t *testing.T, l *Locker, key string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := l.Inspect(ctx, []string{key})
		return err == nil && !st[0].Held, nil
	})
	if err != nil {
		t.Fatalf("key %s still held: %v", key, err)
	}
}

// TestLeaseSurvivesServerRestart: a lease held across a crash and restart
// of the server keeps its token (the row is durable) and stays exclusive;
// fences go on increasing after crash recovery.
func TestLeaseSurvivesServerRestart(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	ctx := ctxFor(t, time.Minute)
	l := newTestLocker(t, cfg)
	held, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"survivor"}, TTL: 30 * time.Second, Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	var renewed *lock.Lease
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		renewed, err = l.Renew(ctx, held, 30*time.Second)
		return err == nil, nil
	})
	if err != nil || renewed.Fence != held.Fence {
		t.Fatalf("Renew after the restart: %+v, %v; want fence %d", renewed, err, held.Fence)
	}
	if _, err := newTestLocker(t, cfg).TryAcquire(ctx, lock.Request{Keys: []string{"survivor"}, TTL: time.Second}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another owner got a lease held across the restart: %v", err)
	}
	if err := l.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	next, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"survivor"}, TTL: time.Second})
	if err != nil || next.Fence <= held.Fence {
		t.Fatalf("after the restart: %+v, %v; want a fence above %d", next, err, held.Fence)
	}
}

// TestEveryConnectionIsDialed: with Dial set, every connection the Locker
// opens (the pool's and the listening one) goes through it, with the host as
// written; a Dial that refuses makes every operation fail with
// ErrBackendUnavailable.
func TestEveryConnectionIsDialed(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	cfg.Host = "localhost" // the certificate-free server; Dial must see the name, not an IP
	var (
		mu    sync.Mutex
		addrs []string
		dials atomic.Int64
	)
	cfg.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		mu.Lock()
		addrs = append(addrs, address)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	l := newTestLocker(t, cfg, WithMaxConns(3))
	ctx := ctxFor(t, time.Minute)
	w, err := l.Watch(ctx, "dialed")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{fmt.Sprintf("dialed-%d", i)}, TTL: 10 * time.Second})
			if err == nil {
				err = l.Release(ctx, lease)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	mustCycle(t, l, "dialed")
	select {
	case <-w:
	case <-time.After(10 * time.Second):
		t.Fatal("no release notification through the dialed listening connection")
	}
	// Every connection the server sees from the Locker was dialed.
	var serverSide int
	raw := s.Conn(t)
	if err := raw.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockwarden'").Scan(&serverSide); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := append([]string(nil), addrs...)
	mu.Unlock()
	want := net.JoinHostPort("localhost", fmt.Sprint(s.Port))
	for _, a := range got {
		if a != want {
			t.Fatalf("Dial got address %q, want %q (the host as written)", a, want)
		}
	}
	if serverSide < 2 || int64(serverSide) > dials.Load() {
		t.Fatalf("the server sees %d connections from the Locker, %d were dialed: want at least 2 (pool and listener), all dialed", serverSide, dials.Load())
	}

	// A dialer that refuses: nothing works, and the errors say why.
	refused := configFor(s)
	refused.Dial = func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("denied by network policy")
	}
	r := newTestLocker(t, refused, WithOperationTimeout(2*time.Second))
	checks := map[string]error{
		"Ping": r.Ping(ctx),
	}
	_, checks["TryAcquire"] = r.TryAcquire(ctx, lock.Request{Keys: []string{"refused"}, TTL: 10 * time.Second})
	_, checks["Inspect"] = r.Inspect(ctx, []string{"refused"})
	_, checks["Watch"] = r.Watch(ctx, "refused")
	checks["Release"] = r.Release(ctx, &lock.Lease{Keys: []string{"refused"}, Owner: "x"})
	for name, err := range checks {
		var ne *lock.NodeError
		if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.As(err, &ne) {
			t.Errorf("%s through a refusing dialer: %v, want ErrBackendUnavailable with a NodeError", name, err)
		}
	}
}

func mustCycle(t *testing.T, l *Locker, key string) {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}
