package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// takeOver makes another owner hold the lock key of lease on server s, as if
// the lease had expired there and someone else had acquired the key.
func takeOver(t *testing.T, s *redistest.Server, lease *lock.Lease) {
	t.Helper()
	c := s.Client()
	ctx := context.Background()
	k := "{" + lease.Keys[0] + "}:lock"
	if err := c.Del(ctx, k).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, k, "another-owner", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
}

// ownerOn reads the owner token of key's lock key on server s.
func ownerOn(t *testing.T, s *redistest.Server, key string) (string, time.Duration) {
	t.Helper()
	c := s.Client()
	ctx := context.Background()
	v, err := c.Get(ctx, "{"+key+"}:lock").Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	owner := redistest.LeaseOwner(v)
	pttl, err := c.PTTL(ctx, "{"+key+"}:lock").Result()
	if err != nil {
		t.Fatal(err)
	}
	return owner, pttl
}

// TestRenewAllWithAPausedNodeKeepsTheHealthyLeases: with one Redlock node
// paused, a batch of 16 lost leases and 4 healthy ones is answered as a
// whole: the healthy ones are renewed on the 2 live nodes (their validity
// is not eaten by the clean-up of the lost ones), the lost ones are reported
// lost.
func TestRenewAllWithAPausedNodeKeepsTheHealthyLeases(t *testing.T) {
	servers := redistest.StartN(t, 3)
	const ttl = 3 * time.Second
	// A paused node costs every call to it the node timeout.
	const nodeTimeout = 300 * time.Millisecond
	l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithNodeTimeout(nodeTimeout))
	ctx := context.Background()

	const lostN, healthyN = 16, 4
	var leases []*lock.Lease
	for i := range lostN + healthyN {
		key := fmt.Sprintf("lost-%02d", i)
		if i >= lostN {
			key = fmt.Sprintf("healthy-%02d", i-lostN)
		}
		var le *lock.Lease
		err := retryQuorum(true, func() (err error) {
			le, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: ttl, Holder: "partial"})
			return err
		})
		if err != nil {
			t.Fatalf("TryAcquire %s: %v", key, err)
		}
		leases = append(leases, le)
	}
	// The lost leases go first in the batch: the healthy ones are answered
	// after them.
	for _, le := range leases[:lostN] {
		takeOver(t, servers[0], le)
		takeOver(t, servers[1], le)
	}
	servers[2].Pause()
	defer servers[2].Resume()

	start := time.Now()
	renewed, errs := l.RenewAll(ctx, leases, ttl)
	took := time.Since(start)
	t.Logf("RenewAll of %d lost and %d healthy leases with one node paused took %v", lostN, healthyN, took)

	for i, le := range leases[:lostN] {
		if !errors.Is(errs[i], lock.ErrLost) || renewed[i] != nil {
			t.Errorf("lease %v taken over on 2 of 3 nodes: renewed %+v, error %v; want an error matching lock.ErrLost", le.Keys, renewed[i], errs[i])
		}
	}
	now := time.Now()
	for i := lostN; i < len(leases); i++ {
		le := leases[i]
		if errs[i] != nil || renewed[i] == nil {
			t.Errorf("healthy lease %v (renewable on 2 of 3 nodes): error %v; want it renewed", le.Keys, errs[i])
			continue
		}
		if !renewed[i].Expires.After(now) {
			t.Errorf("healthy lease %v renewed until %v, already past when RenewAll returned", le.Keys, renewed[i].Expires)
		}
		for _, s := range servers[:2] {
			owner, pttl := ownerOn(t, s, le.Keys[0])
			if owner != le.Owner || pttl <= 0 {
				t.Errorf("healthy lease %v on %s: lock key held by %q with PTTL %v; want its owner with a TTL", le.Keys, s.Addr, owner, pttl)
			}
		}
	}
	// The live nodes gave the lost leases' keys to their new owner: nothing
	// of the old owner is left there.
	for _, le := range leases[:lostN] {
		for _, s := range servers[:2] {
			if owner, _ := ownerOn(t, s, le.Keys[0]); owner == le.Owner {
				t.Errorf("lost lease %v still holds its key on %s", le.Keys, s.Addr)
			}
		}
	}
}

// TestRenewAllReleasesLostLeasesWhereTheyAreStillHeld: a lease taken over on
// 2 of 3 nodes is lost; the third node, where the renewal still succeeded,
// gets the key released rather than kept until the TTL.
func TestRenewAllReleasesLostLeasesWhereTheyAreStillHeld(t *testing.T) {
	servers := redistest.StartN(t, 3)
	const ttl = 30 * time.Second
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()

	var leases []*lock.Lease
	for i := range 16 {
		le, err := l.TryAcquire(ctx, lock.Request{Keys: []string{fmt.Sprintf("gone-%02d", i)}, TTL: ttl, Holder: "partial"})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
		takeOver(t, servers[0], le)
		takeOver(t, servers[1], le)
	}
	_, errs := l.RenewAll(ctx, leases, ttl)
	for i, err := range errs {
		if !errors.Is(err, lock.ErrLost) {
			t.Fatalf("lease %v: %v, want an error matching lock.ErrLost", leases[i].Keys, err)
		}
	}
	c := servers[2].Client()
	for _, le := range leases {
		k := "{" + le.Keys[0] + "}:lock"
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := c.Exists(ctx, k).Result()
			return err == nil && n == 0, nil
		})
		if err != nil {
			t.Fatalf("lost lease %v still holds its key on the node that renewed it", le.Keys)
		}
	}
}

// TestSlowRenewalNamesTheNodesThatAgreed: a renewal that every node accepted
// but that took longer than the TTL allows fails with a quorum error saying
// that all 3 nodes agreed (the validity, not the nodes, was missing).
func TestSlowRenewalNamesTheNodesThatAgreed(t *testing.T) {
	servers := redistest.StartN(t, 3)
	const ttl = time.Second
	cfg := Config{Addrs: addrs(servers)}
	ctx := context.Background()
	le, err := newTestLocker(t, cfg).TryAcquire(ctx, lock.Request{Keys: []string{"slow-renewal"}, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	for name, renew := range map[string]func(l *Locker) error{
		"Renew": func(l *Locker) error { _, err := l.Renew(ctx, le, ttl); return err },
		"RenewAll": func(l *Locker) error {
			_, errs := l.RenewAll(ctx, []*lock.Lease{le}, ttl)
			return errs[0]
		},
	} {
		t.Run(name, func(t *testing.T) {
			// The clock jumps past the TTL between the start and the end of the renewal.
			l := newTestLocker(t, cfg, WithClock(&jumpClock{jump: ttl}))
			err := renew(l)
			var qe *QuorumError
			if !errors.As(err, &qe) || qe.Agreed != 3 || qe.Needed != 2 || !strings.Contains(err.Error(), "3 of 3 nodes agreed") {
				t.Fatalf("renewal with no validity left: %v; want a *QuorumError saying 3 of 3 nodes agreed, 2 needed", err)
			}
		})
	}
}

// commandCalls reads how many times s ran cmd (INFO commandstats).
func commandCalls(t *testing.T, s *redistest.Server, cmd string) int {
	t.Helper()
	info, err := s.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(rest, "%d", &n); err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		return n
	}
	return 0
}

// TestRenewAllAfterScriptFlushResendsWithEvalSha: a node that lost its script
// cache gets the scripts loaded once and the failed renewals again by SHA,
// not the whole batch with the script text of every lease.
func TestRenewAllAfterScriptFlushResendsWithEvalSha(t *testing.T) {
	servers := redistest.StartN(t, 3)
	const ttl = 30 * time.Second
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()
	var leases []*lock.Lease
	for i := range 500 {
		req := lock.Request{Keys: []string{fmt.Sprintf("flushed-%03d", i)}, TTL: ttl}
		if i%2 == 1 {
			req.Limit = 3 // a semaphore slot: the other renew script
		}
		le, err := l.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
	}
	flushed := servers[1]
	if err := flushed.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	evalBefore, shaBefore := commandCalls(t, flushed, "eval"), commandCalls(t, flushed, "evalsha")

	renewed, errs := l.RenewAll(ctx, leases, ttl)
	for i := range leases {
		if errs[i] != nil || renewed[i] == nil {
			t.Fatalf("lease %v: %v; want it renewed after the script cache was flushed on one node", leases[i].Keys, errs[i])
		}
	}
	evals, shas := commandCalls(t, flushed, "eval")-evalBefore, commandCalls(t, flushed, "evalsha")-shaBefore
	t.Logf("node with the flushed script cache: %d EVAL, %d EVALSHA for a batch of %d", evals, shas, len(leases))
	if evals != 0 {
		t.Errorf("%d EVAL calls on the node that lost its script cache: want the renewals re-sent by SHA after loading the scripts", evals)
	}
	// The renewals did happen there: every lock key was extended to the new TTL.
	for _, le := range leases[:1] {
		if owner, pttl := ownerOn(t, flushed, le.Keys[0]); owner != le.Owner || pttl <= ttl-5*time.Second {
			t.Errorf("lease %v on the flushed node: owner %q, PTTL %v", le.Keys, owner, pttl)
		}
	}
}

// TestRenewAllOfMoreLeasesThanOneTimeoutFits: a batch of 60,000 leases is
// more than one node answers within the per-node timeout (the generous 1s
// of the tests here; the default is 100ms): it is still renewed as a whole,
// since the timeout bounds each pipeline of the batch, not the batch.
func TestRenewAllOfMoreLeasesThanOneTimeoutFits(t *testing.T) {
	s := redistest.Start(t)
	const ttl = 30 * time.Second
	const n = 60000
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	ctx := context.Background()
	// The leases are written straight into Redis, as acquisitions would
	// leave them (acquiring them one by one would take most of the test).
	leases := make([]*lock.Lease, n)
	c := s.Client()
	pipe := c.Pipeline()
	for i := range leases {
		le := &lock.Lease{Keys: []string{fmt.Sprintf("many-%06d", i)}, Owner: fmt.Sprintf("owner-%06d", i), Fence: int64(i + 1), TTL: ttl}
		leases[i] = le
		pipe.Set(ctx, "{"+le.Keys[0]+"}:lock", redistest.LeaseValue(le.Owner, le.Fence, 1700000000000000, "many"), time.Minute)
		if pipe.Len() >= 2000 || i == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	start := time.Now()
	renewed, errs := l.RenewAll(ctx, leases, ttl)
	t.Logf("RenewAll of %d leases took %v", n, time.Since(start))
	failed := 0
	var first error
	for i := range leases {
		if errs[i] != nil || renewed[i] == nil {
			if failed++; first == nil {
				first = errs[i]
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d leases not renewed (first error: %v); want all renewed", failed, n, first)
	}
	// Written with a minute to live, renewed to 30 seconds.
	if _, pttl := ownerOn(t, s, leases[n-1].Keys[0]); pttl > ttl || pttl < ttl/2 {
		t.Errorf("the last lease of the batch has a PTTL of %v in Redis, want it set to the %v TTL", pttl, ttl)
	}
}
