package backend

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// countingChecker counts the settings checks of a Redis Locker.
type countingChecker struct {
	*redislock.Locker
	checks atomic.Int64
}

func (c *countingChecker) CheckServers(ctx context.Context) ([]lock.Finding, error) {
	f, err := c.Locker.CheckServers(ctx)
	c.checks.Add(1)
	return f, err
}

// TestConfigCheckFollowsTheServers: the registry reads the settings of a
// Redlock backend in use and reports each node whose maxmemory-policy may
// evict lock keys; a node that stops answering keeps its finding (nothing
// says it was fixed), a node changed to an unsafe policy is found at the
// next check, and a node back with noeviction is cleared. Every change is
// told to the health listeners.
func TestConfigCheckFollowsTheServers(t *testing.T) {
	servers := redistest.StartN(t, 3)
	setPolicy := func(s *redistest.Server, p string) {
		t.Helper()
		if err := s.Client().ConfigSet(context.Background(), "maxmemory-policy", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy(servers[0], "allkeys-lru")
	ctx := context.Background()
	var checker *countingChecker
	r := NewRegistry(ctx, nil, func(cfg Config) (Locker, error) {
		l, err := redislock.New(*cfg.Engine.(*redislock.Config), redislock.WithNodeTimeout(time.Second))
		if err != nil {
			return nil, err
		}
		checker = &countingChecker{Locker: l}
		return checker, nil
	}, logr.Discard())
	r.SetHealthInterval(50 * time.Millisecond)
	r.SetConfigCheckInterval(50 * time.Millisecond)
	var told atomic.Int64
	r.OnHealth(func(string, error) { told.Add(1) })
	h, err := r.For(ctx, holder.Ref{Kind: "DistributedLock", Namespace: "team-a", Name: "billing"},
		lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{servers[0].Addr, servers[1].Addr, servers[2].Addr}}))
	if err != nil {
		t.Fatal(err)
	}
	nodes := func() string {
		checked, fs := r.ConfigOf(h.ID)
		if !checked {
			return "not checked"
		}
		var out []string
		for _, f := range fs {
			out = append(out, fmt.Sprintf("[%s %s]", f.Node, f.Found))
		}
		slices.Sort(out)
		return strings.Join(out, "")
	}
	// want lists findings as nodes does: sorted.
	want := func(entries ...string) string {
		slices.Sort(entries)
		return strings.Join(entries, "")
	}
	waitFor := func(what, expected string) {
		t.Helper()
		var got string
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			got = nodes()
			return got == expected, nil
		})
		if err != nil {
			t.Fatalf("%s: findings %s, want %s", what, got, expected)
		}
	}
	// afterChecks waits until n more checks completed.
	afterChecks := func(n int64) {
		t.Helper()
		target := checker.checks.Load() + n
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			return checker.checks.Load() >= target, nil
		}); err != nil {
			t.Fatalf("fewer than %d settings checks in 20s", n)
		}
	}

	waitFor("first check", fmt.Sprintf("[%s allkeys-lru]", servers[0].Addr))
	if told.Load() == 0 {
		t.Error("the health listeners were not told of the first findings")
	}

	servers[0].Kill()
	afterChecks(2)
	if got, want := nodes(), fmt.Sprintf("[%s allkeys-lru]", servers[0].Addr); got != want {
		t.Fatalf("with the node down: findings %s, want its last finding kept: %s", got, want)
	}

	before := told.Load()
	setPolicy(servers[1], "volatile-lru")
	waitFor("a second node set to volatile-lru", want(fmt.Sprintf("[%s allkeys-lru]", servers[0].Addr), fmt.Sprintf("[%s volatile-lru]", servers[1].Addr)))
	if told.Load() == before {
		t.Error("the health listeners were not told of the new finding")
	}

	servers[0].Restart() // empty, with Redis's default policy: noeviction
	setPolicy(servers[1], "noeviction")
	waitFor("both nodes back to noeviction", "")
}
