package redis

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// countingClient counts a node's round trips: pipelines, and scripts run
// outside one.
type countingClient struct {
	client
	pipelines, scripts atomic.Int32
}

func (c *countingClient) Pipeline() goredis.Pipeliner {
	c.pipelines.Add(1)
	return c.client.Pipeline()
}

func (c *countingClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	c.scripts.Add(1)
	return c.client.EvalSha(ctx, sha1, keys, args...)
}

func (c *countingClient) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	c.scripts.Add(1)
	return c.client.Eval(ctx, script, keys, args...)
}

// TestInspectManyAnswersAsInspectInOneRoundTrip: InspectMany reports for
// each lock what Inspect reports, held or free, mutex or semaphore, on one
// node and on Redlock, in one round trip per node however many locks it is
// given; an invalid set of keys fails alone.
func TestInspectManyAnswersAsInspectInOneRoundTrip(t *testing.T) {
	for name, n := range map[string]int{"standalone": 1, "redlock": 3} {
		t.Run(name, func(t *testing.T) {
			servers := redistest.StartN(t, n)
			l := newTestLocker(t, Config{Addrs: addrs(servers)})
			ctx := context.Background()
			const locks = 300 // more than one script call's worth of keys
			var keys [][]string
			for i := range locks {
				k := []string{fmt.Sprintf("k%03d", i)}
				if i%7 == 0 {
					k = append(k, fmt.Sprintf("extra%03d", i))
				}
				keys = append(keys, k)
				switch i % 3 {
				case 0:
					if _, err := l.TryAcquire(ctx, lock.Request{Keys: k, TTL: time.Minute, Holder: fmt.Sprintf("h%d", i)}); err != nil {
						t.Fatal(err)
					}
				case 1:
					if _, err := l.TryAcquire(ctx, lock.Request{Keys: k, TTL: time.Minute, Holder: fmt.Sprintf("s%d", i), Limit: 3}); err != nil {
						t.Fatal(err)
					}
				}
			}
			keys = append(keys, nil) // invalid: no key
			// The nodes have the script cached, as they do but for the first call.
			if _, err := l.Inspect(ctx, keys[0]); err != nil {
				t.Fatal(err)
			}
			waitIdle(t, l) // the acquisitions' late calls must not count below
			counters := make([]*countingClient, n)
			before := make([]int, n)
			for i, nd := range l.nodes {
				counters[i] = &countingClient{client: nd.client}
				nd.client = counters[i]
				before[i] = evalCalls(t, servers[i].Client())
			}
			states, errs := l.InspectMany(ctx, keys)
			for i, c := range counters {
				if p, s := c.pipelines.Load(), c.scripts.Load(); p != 1 || s != 0 {
					t.Errorf("node %d: InspectMany of %d locks took %d pipelines and %d scripts outside one, want one pipeline", i, locks, p, s)
				}
				// 343 lock keys: three script calls of at most inspectChunkKeys.
				if calls := evalCalls(t, servers[i].Client()) - before[i]; calls != 3 {
					t.Errorf("node %d: %d script calls for %d locks, want 3", i, calls, locks)
				}
				nd := l.nodes[i]
				nd.client = c.client
			}
			if errs[locks] == nil {
				t.Errorf("InspectMany of no keys: no error")
			}
			for i := range locks {
				if errs[i] != nil {
					t.Fatalf("locks[%d]: %v", i, errs[i])
				}
				want, err := l.Inspect(ctx, keys[i])
				if err != nil {
					t.Fatal(err)
				}
				for j := range want {
					// Expiries are computed from the time of each call.
					want[j].Expires, states[i][j].Expires = time.Time{}, time.Time{}
					for h := range want[j].Holders {
						want[j].Holders[h].Expires = time.Time{}
					}
					for h := range states[i][j].Holders {
						states[i][j].Holders[h].Expires = time.Time{}
					}
				}
				if !reflect.DeepEqual(states[i], want) {
					t.Fatalf("locks[%d]: InspectMany = %+v, Inspect = %+v", i, states[i], want)
				}
				if held := states[i][0].Held; held != (i%3 != 2) {
					t.Fatalf("locks[%d]: held = %v", i, held)
				}
			}
		})
	}
}

// TestInspectManyFallsBackToInspect: a Locker without InspectMany is
// inspected one set of keys at a time.
func TestInspectManyFallsBackToInspect(t *testing.T) {
	s := redistest.Start(t)
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	ctx := context.Background()
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"a"}, TTL: time.Minute, Holder: "ha"}); err != nil {
		t.Fatal(err)
	}
	states, errs := lock.InspectMany(ctx, onlyLocker{l}, [][]string{{"a"}, {"b"}})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if !states[0][0].Held || states[0][0].Holder != "ha" || states[1][0].Held {
		t.Fatalf("states = %+v", states)
	}
}

// onlyLocker hides every method but lock.Locker's.
type onlyLocker struct{ lock.Locker }
