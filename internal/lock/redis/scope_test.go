package redis

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestScopedLockerNeedsOnlyItsNamespace: a Redis user whose ACL covers one
// namespace's keys and channels, and nothing else on the server, can do
// everything a namespace's backend does (queue, notifications of every key,
// release) once the Locker has that namespace's scope; the same user
// without the scope is refused by Redis (the ticket counter shared by every
// namespace and the pattern of every key's releases are outside its ACL),
// and it can neither write another namespace's keys nor wake its waiters.
func TestScopedLockerNeedsOnlyItsNamespace(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.SetUser(ctx, "team-a", "secret", append(slices.Clone(redistest.LockwardenCommands), redistest.NamespaceACL("team-a")...)...); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Addrs: []string{srv.Addr}, Prefix: "lockwarden:", Username: "team-a", Password: "secret"}

	t.Run("without the scope, Redis refuses", func(t *testing.T) {
		l := newTestLocker(t, cfg)
		if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"ns/team-a/billing"}, TTL: time.Second, Owner: mustOwner(t), Queue: true}); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("acquiring with the shared ticket counter: %v, want NOPERM", err)
		}
		if _, err := l.Watch(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("watching every key's releases: %v, want NOPERM", err)
		}
	})

	t.Run("with the scope", func(t *testing.T) {
		scoped := cfg
		scoped.Scopes = []string{"ns/team-a/"}
		l := newTestLocker(t, scoped)
		all, err := l.Watch(ctx)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		key := "ns/team-a/billing"
		h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: mustOwner(t)})
		if err != nil {
			t.Fatal(err)
		}
		w := lock.Request{Keys: []string{key}, TTL: 5 * time.Second, Owner: mustOwner(t), Queue: true}
		var held *lock.HeldError
		if _, err := l.TryAcquire(ctx, w); !errors.As(err, &held) || held.Position != 0 {
			t.Fatalf("queued waiter: %v, want held with the waiter first in the queue", err)
		}
		if err := l.Release(ctx, h); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-all:
			if got != key {
				t.Errorf("released key %q, want %q", got, key)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no release notification")
		}
		if _, err := l.TryAcquire(ctx, w); err != nil {
			t.Fatalf("the waiter's turn: %v", err)
		}

		// The scope is enforced before anything is sent.
		var invalid *lock.InvalidRequestError
		_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{"ns/team-b/billing"}, TTL: time.Second, Owner: mustOwner(t)})
		if !errors.As(err, &invalid) || invalid.Field != "keys[0]" || !strings.Contains(err.Error(), `"ns/team-a/"`) {
			t.Errorf("a key of another namespace: %v, want an invalid request naming keys[0] and the scope", err)
		}
		for name, err := range map[string]error{
			"Inspect": func() error { _, err := l.Inspect(ctx, []string{"ns/team-b/billing"}); return err }(),
			"Dequeue": l.Dequeue(ctx, []string{"ns/team-b/billing"}, mustOwner(t)),
			"Watch":   func() error { _, err := l.Watch(ctx, "ns/team-b/billing"); return err }(),
			"Release": l.Release(ctx, &lock.Lease{Keys: []string{"ns/team-b/billing"}, Owner: mustOwner(t), Fence: 1}),
		} {
			if !errors.As(err, &invalid) {
				t.Errorf("%s of another namespace's key: %v, want an invalid request", name, err)
			}
		}
	})

	t.Run("the user cannot reach another namespace", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: "team-a", Password: "secret", Protocol: 2})
		defer func() { _ = c.Close() }()
		for _, cmd := range [][]any{
			{"SET", "lockwarden:lockwarden:ticket", "x"},
			{"DEL", "lockwarden:{ns/team-b/billing}:lock"},
			{"PUBLISH", "lockwarden:{ns/team-b/billing}:released", "ns/team-b/billing 1"},
		} {
			if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("%v: %v, want NOPERM", cmd, err)
			}
		}
	})
}

// TestScopesConfig: scopes that would break the hash tag, read as glob
// patterns or repeat are refused, naming the scope.
func TestScopesConfig(t *testing.T) {
	for _, bad := range [][]string{{""}, {"ns/a/*"}, {"ns/{a}/"}, {"ns/a /"}, {"ns/a/", "ns/a/"}, {"ns/[a]/"}, {"ns/a\x1b/"}} {
		err := Config{Addrs: []string{"127.0.0.1:6379"}, Scopes: bad}.Validate()
		var ce *lock.ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "Scopes") {
			t.Errorf("Scopes %q: %v, want a lock.ConfigError naming Scopes", bad, err)
		}
	}
	if err := (Config{Addrs: []string{"127.0.0.1:6379"}, Scopes: []string{"ns/a/", "global/"}}).Validate(); err != nil {
		t.Errorf("valid scopes: %v", err)
	}
	l := newTestLocker(t, Config{Addrs: []string{"127.0.0.1:1"}, Prefix: "lockwarden:", Scopes: []string{"ns/a/", "global/"}})
	var invalid *lock.InvalidRequestError
	_, err := l.TryAcquire(context.Background(), lock.Request{Keys: []string{"ns/a/x", "global/y"}, TTL: time.Second, Owner: "o"})
	if !errors.As(err, &invalid) || invalid.Field != "keys[1]" {
		t.Errorf("keys in two scopes: %v, want an invalid request naming keys[1]", err)
	}
}

// TestNewTicketCounterQueuesBehind: the waiters already queued on a key keep
// their places when the counter a newcomer's ticket is drawn from is new
// (a scope's counter, right after an upgrade from the shared one), was
// deleted, or holds something that is not a number: the newcomer queues
// behind them.
func TestNewTicketCounterQueuesBehind(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	key := "ns/a/billing"
	shared := newTestLocker(t, Config{Addrs: []string{srv.Addr}, Prefix: "lockwarden:"})
	scoped := newTestLocker(t, Config{Addrs: []string{srv.Addr}, Prefix: "lockwarden:", Scopes: []string{"ns/a/"}})
	if err := srv.Client().Set(ctx, "lockwarden:lockwarden:ticket", 1_000_000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	h, err := shared.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shared.Release(ctx, h) }()
	queue := func(l *Locker) int {
		t.Helper()
		var held *lock.HeldError
		_, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 10 * time.Second, Owner: mustOwner(t), Queue: true})
		if !errors.As(err, &held) {
			t.Fatalf("queueing: %v, want held", err)
		}
		return held.Position
	}
	if p := queue(shared); p != 0 {
		t.Fatalf("first waiter at %d, want 0", p)
	}
	if p := queue(scoped); p != 1 {
		t.Errorf("a waiter from the scope's new counter at %d, want 1 (behind the waiter already queued)", p)
	}
	if err := srv.Client().Set(ctx, "lockwarden:{ns/a/}:ticket", "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if p := queue(scoped); p != 2 {
		t.Errorf("a waiter from a counter that holds no number at %d, want 2", p)
	}
	if err := srv.Client().Del(ctx, "lockwarden:{ns/a/}:ticket").Err(); err != nil {
		t.Fatal(err)
	}
	if p := queue(scoped); p != 3 {
		t.Errorf("a waiter from a deleted counter at %d, want 3", p)
	}
}

// TestWatchDeliversOnlyTheChannelsKey: a message on one key's release
// channel that names another key wakes nobody: whoever may publish on a
// channel cannot wake the waiters of other keys (another namespace's).
func TestWatchDeliversOnlyTheChannelsKey(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := newTestLocker(t, Config{Addrs: []string{srv.Addr}, Prefix: "lockwarden:"})
	all, err := l.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client()
	if err := c.Publish(ctx, "lockwarden:{ns/a/x}:released", "ns/b/y 7").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "lockwarden:{ns/a/x}:released", "ns/a/x 8").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-all:
		if got != "ns/a/x" {
			t.Errorf("delivered %q, want only ns/a/x (the key of the channel)", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release notification")
	}
}

// TestScopedLockerUnderThePrefixACL: a server whose lockwarden user was set
// up before scopes, for the whole prefix (docs/backends.md's minimal ACL,
// whose channel rule names only the prefix's pattern), keeps its release
// notifications when the operator gives the backend a scope: Redis refuses
// the scope's pattern, the Locker subscribes to the prefix's instead, and
// delivers the releases of its scope only.
func TestScopedLockerUnderThePrefixACL(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.SetUser(ctx, "locks", "secret", minimalACL...); err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, Config{Addrs: []string{srv.Addr}, Prefix: "lockwarden:", Username: "locks", Password: "secret", Scopes: []string{"ns/a/"}})
	all, err := l.Watch(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	c := srv.Client()
	if err := c.Publish(ctx, "lockwarden:{ns/b/y}:released", "ns/b/y 1").Err(); err != nil {
		t.Fatal(err)
	}
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"ns/a/x"}, TTL: time.Second, Owner: mustOwner(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-all:
		if got != "ns/a/x" {
			t.Errorf("delivered %q, want only ns/a/x (another namespace's release is not the scope's)", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release notification")
	}
}
