package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

func setPolicy(t *testing.T, s *redistest.Server, policy string) {
	t.Helper()
	if err := s.Client().ConfigSet(context.Background(), "maxmemory-policy", policy).Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy %s on %s: %v", policy, s.Addr, err)
	}
}

// TestCheckServersFindsEvictingNodes: a Redlock node whose maxmemory-policy
// may evict keys (allkeys-lru, and volatile-ttl, which picks among keys with
// a TTL such as every lock key) is named with the policy found and the fix;
// a node with noeviction is not, and setting noeviction clears the finding.
func TestCheckServersFindsEvictingNodes(t *testing.T) {
	servers := redistest.StartN(t, 3)
	setPolicy(t, servers[0], "allkeys-lru")
	setPolicy(t, servers[2], "volatile-ttl")
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()

	findings, err := l.CheckServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 2 {
		t.Fatalf("findings = %v, want one for %s and one for %s", findings, servers[0].Addr, servers[2].Addr)
	}
	for i, want := range []struct{ node, policy string }{{servers[0].Addr, "allkeys-lru"}, {servers[2].Addr, "volatile-ttl"}} {
		f := findings[i]
		if f.Node != want.node || f.Setting != "maxmemory-policy" || f.Found != want.policy || f.Want != "noeviction" {
			t.Errorf("finding %d = %+v, want node %s with maxmemory-policy %s", i, f, want.node, want.policy)
		}
		msg := f.String()
		for _, sub := range []string{want.node, want.policy, "CONFIG SET maxmemory-policy noeviction", "redis.conf"} {
			if !strings.Contains(msg, sub) {
				t.Errorf("finding %q does not say %q", msg, sub)
			}
		}
	}

	setPolicy(t, servers[0], "noeviction")
	setPolicy(t, servers[2], "noeviction")
	if findings, err := l.CheckServers(ctx); err != nil || len(findings) != 0 {
		t.Fatalf("after setting noeviction everywhere: findings %v, error %v; want none", findings, err)
	}
}

// TestCheckServersWithoutConfigPermission: a user whose ACL does not allow
// CONFIG still uses the locks; the check says at debug level that it could
// not verify the setting and reports no finding and no error, even where
// the policy is unsafe (it cannot know).
func TestCheckServersWithoutConfigPermission(t *testing.T) {
	s := redistest.Start(t)
	setPolicy(t, s, "allkeys-lru")
	admin := s.Client()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "locks", "on", ">secret", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}, Username: "locks", Password: "secret"}, WithLogger(log))
	ctx := context.Background()

	findings, err := l.CheckServers(ctx)
	if err != nil || len(findings) != 0 {
		t.Fatalf("CheckServers without CONFIG: findings %v, error %v; want neither", findings, err)
	}
	mu.Lock()
	all := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(all, "Could not verify") || !strings.Contains(all, s.Addr) || !strings.Contains(all, "NOPERM") {
		t.Errorf("log = %q, want a debug line saying the setting of %s could not be verified (NOPERM)", all, s.Addr)
	}
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: lock.MinTTL * 10})
	if err != nil {
		t.Fatalf("the locks must work without CONFIG: %v", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestCheckServersWithANodeDown: the nodes that answer are checked, and the
// error names the one that does not.
func TestCheckServersWithANodeDown(t *testing.T) {
	servers := redistest.StartN(t, 3)
	setPolicy(t, servers[1], "allkeys-lfu")
	servers[2].Kill()
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	findings, err := l.CheckServers(context.Background())
	var ne *lock.NodeError
	if !errors.As(err, &ne) || ne.Node != servers[2].Addr {
		t.Errorf("error = %v, want a NodeError naming %s", err, servers[2].Addr)
	}
	if got := fmt.Sprint(findings); len(findings) != 1 || findings[0].Node != servers[1].Addr || findings[0].Found != "allkeys-lfu" {
		t.Errorf("findings = %s, want one for %s (allkeys-lfu)", got, servers[1].Addr)
	}
}

// minimalACL is the ACL docs/backends.md ("Redis requirements") gives a
// lockwarden user with the key prefix "lockwarden:".
var minimalACL = append(slices.Clone(redistest.LockwardenCommands), "~lockwarden:*", "&lockwarden:{*}:released")

// TestMinimalACL: a user with exactly the documented ACL can use every
// operation (mutex, semaphore, queue, inspect, release notifications,
// Redlock fence write-back) and the settings check; without CONFIG GET
// only the check degrades.
func TestMinimalACL(t *testing.T) {
	servers := redistest.StartN(t, 3)
	for _, s := range servers {
		if err := s.SetUser(context.Background(), "locks", "secret", minimalACL...); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy(t, servers[1], "allkeys-lru")
	for _, tc := range []struct {
		name  string
		addrs []string
	}{{"standalone", addrs(servers[:1])}, {"redlock", addrs(servers)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l := newTestLocker(t, Config{Addrs: tc.addrs, Prefix: "lockwarden:", Username: "locks", Password: "secret"})
			if err := l.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			all, err := l.Watch(ctx)
			if err != nil {
				t.Fatalf("Watch (PSUBSCRIBE): %v", err)
			}
			one, err := l.Watch(ctx, "a")
			if err != nil {
				t.Fatalf("Watch a (SUBSCRIBE): %v", err)
			}
			// One free key: acquirefast.lua's path.
			single, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"one"}, TTL: time.Second, Owner: mustOwner(t)})
			if err != nil {
				t.Fatalf("one free key: %v", err)
			}
			if err := l.Release(ctx, single); err != nil {
				t.Fatal(err)
			}
			owner, other := mustOwner(t), mustOwner(t)
			a, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"a", "b"}, TTL: time.Second, Owner: owner})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"a"}, TTL: time.Second, Owner: other, Queue: true}); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("queued request on a held key: %v, want ErrNotAcquired", err)
			}
			if _, err := l.Inspect(ctx, []string{"a"}); err != nil {
				t.Fatal(err)
			}
			if a, err = l.Renew(ctx, a, time.Second); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx, a); err != nil {
				t.Fatal(err)
			}
			for _, ch := range []<-chan string{all, one} {
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Fatal("no release notification")
				}
			}
			sem := lock.Request{Keys: []string{"s"}, TTL: time.Second, Limit: 2}
			s1, err := l.TryAcquire(ctx, sem)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Renew(ctx, s1, time.Second); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx, s1); err != nil {
				t.Fatal(err)
			}
			if err := l.Dequeue(ctx, []string{"a"}, other); err != nil {
				t.Fatal(err)
			}
			findings, err := l.CheckServers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "redlock" && (len(findings) != 1 || findings[0].Node != servers[1].Addr) {
				t.Errorf("CheckServers with CONFIG GET allowed: %v, want the allkeys-lru node %s", findings, servers[1].Addr)
			}
		})
	}
}

func mustOwner(t *testing.T) string {
	t.Helper()
	o, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	return o
}
