package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
)

// mustTake acquires req with l or fails the test.
func mustTake(t *testing.T, l *Locker, req lock.Request) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("TryAcquire of %s: %v", req.Holder, err)
	}
	return lease
}

// mustQueue makes one queued TryAcquire of req that is refused.
func mustQueue(t *testing.T, l *Locker, req lock.Request) {
	t.Helper()
	if lease, err := l.TryAcquire(ctxT(t, 10*time.Second), req); lease != nil || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of %s: lease %+v, error %v; want it refused and queued", req.Holder, lease, err)
	}
}

// retryUnavailable calls f until it returns an error other than
// lock.ErrBackendUnavailable (a member went away and the client moves to
// another one), for up to 30s, and returns that error.
func retryUnavailable(t *testing.T, f func(ctx context.Context) error) error {
	t.Helper()
	var last error
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = f(ctx)
		return !errors.Is(last, lock.ErrBackendUnavailable), nil
	})
	return last
}

// TestReplaceMarkOutlivesItsLocker: the replacement mark is a key of the
// store on an etcd lease of its own (two waiter TTLs), not on the replacing
// Locker's session: the replaced owner is told so by a new Locker (its
// process restarted) after the replacing Locker closed, and queues again
// once the mark expired.
func TestReplaceMarkOutlivesItsLocker(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/policies/mark/"}
	ctx := ctxT(t, time.Minute)
	key := "ns/a/job"
	hl := newTestLocker(t, cfg)
	h := mustTake(t, hl, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "holder"})
	w := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "w", Queue: true}
	mustQueue(t, newTestLocker(t, cfg), w)
	rl := newTestLocker(t, cfg)
	mustQueue(t, rl, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "r", Queue: true, Replace: true})
	replaced := time.Now()
	if err := rl.Close(); err != nil {
		t.Fatal(err)
	}

	cli := adminClient(t, m.Cluster())
	mark := cfg.Prefix + "r/" + escapeKey(key) + "/" + ownerTag(w.Owner)
	resp, err := cli.Get(ctx, mark)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("replacement mark %s: %v; want one key on an etcd lease", mark, resp.Kvs)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL < 2 {
		t.Fatalf("the mark's etcd lease was granted for %ds; want two waiter TTLs (2s) at least", ttl.GrantedTTL)
	}

	wl := newTestLocker(t, cfg)
	if lease, err := wl.TryAcquire(ctx, w); lease != nil || !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the replaced waiter calling again through a new Locker: lease %+v, error %v; want ErrReplaced only", lease, err)
	}
	var err2 error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err2 = wl.TryAcquire(ctx, w)
		return !errors.Is(err2, lock.ErrReplaced), nil
	}); err != nil {
		t.Fatalf("the mark did not expire within 20s: %v", err2)
	}
	if !errors.Is(err2, lock.ErrNotAcquired) {
		t.Fatalf("the waiter once its mark expired: %v; want it queued again (ErrNotAcquired)", err2)
	}
	if d := time.Since(replaced); d < time.Second {
		t.Fatalf("the mark lasted %v; want at least the waiter TTL (1s)", d)
	}
	if err := wl.Dequeue(ctx, w.Keys, w.Owner); err != nil {
		t.Fatal(err)
	}
	if err := hl.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestPreemptionSurvivesANewLocker: the preemption is in the holder's
// value, so the holder's next process (a new Locker renewing the stored
// lease) is told so too, more than once, and releases the key with the
// same token; the preempting request then takes it.
func TestPreemptionSurvivesANewLocker(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/policies/restart/"}
	ctx := ctxT(t, time.Minute)
	key := "ns/a/job"
	old := newTestLocker(t, cfg)
	h := mustTake(t, old, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "holder"})
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	rl := newTestLocker(t, cfg)
	r := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "r", Queue: true, Replace: true, Preempt: true}
	mustQueue(t, rl, r)

	l := newTestLocker(t, cfg)
	for i := range 2 {
		if _, err := l.Renew(ctx, stored(h), 30*time.Second); !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
			t.Fatalf("renewal %d of the preempted lease by a new Locker: %v; want ErrPreempted", i+1, err)
		}
	}
	st, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if !st[0].Held || st[0].Fence != h.Fence {
		t.Fatalf("Inspect = %+v; want still held with token %d", st[0], h.Fence)
	}
	if err := l.Release(ctx, stored(h)); err != nil {
		t.Fatalf("Release of the preempted lease: %v", err)
	}
	got := mustTake(t, rl, r)
	if got.Fence <= h.Fence {
		t.Fatalf("token %d, want more than the preempted lease's %d", got.Fence, h.Fence)
	}
	if err := rl.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// TestPreemptedLeaseLeavesTheSession: a Locker keeps renewing two leases of
// one TTL, on one session; one of them is preempted. Its renewals fail and
// no longer keep it: the preempting request gets the key once the lease's
// TTL ends (never before its Expires), while the other lease, whose
// renewals keep the session alive, stays held.
func TestPreemptedLeaseLeavesTheSession(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/policies/session/"}
	ctx := ctxT(t, time.Minute)
	ttl := 3 * time.Second
	l := newTestLocker(t, cfg)
	p := mustTake(t, l, lock.Request{Keys: []string{"preempted"}, TTL: ttl, Owner: ownerToken(t), Holder: "p"})
	o := mustTake(t, l, lock.Request{Keys: []string{"other"}, TTL: ttl, Owner: ownerToken(t), Holder: "o"})

	type result struct {
		lease *lock.Lease
		err   error
		at    time.Time
	}
	done := make(chan result, 1)
	go func() {
		lease, err := newTestLocker(t, cfg).Acquire(ctx, lock.Request{Keys: []string{"preempted"}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "r", Queue: true, Replace: true, Preempt: true})
		done <- result{lease, err, time.Now()}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var got result
	for got.at.IsZero() {
		select {
		case got = <-done:
		case <-tick.C:
			out, errs := l.RenewAll(ctx, []*lock.Lease{p, o}, ttl)
			if errs[0] != nil && !errors.Is(errs[0], lock.ErrPreempted) && !errors.Is(errs[0], lock.ErrLost) {
				t.Fatalf("renewal of the preempted lease: %v", errs[0])
			}
			if errs[0] == nil {
				// Not preempted yet: the request has not read the key.
				p = out[0]
			}
			if errs[1] != nil {
				t.Fatalf("renewal of the other lease: %v", errs[1])
			}
			o = out[1]
		}
	}
	if got.err != nil {
		t.Fatalf("Acquire with Preempt: %v", got.err)
	}
	if got.at.Before(p.Expires) {
		t.Fatalf("the preempting request had the key at %s, before the preempted lease's Expires %s", got.at.Format(time.RFC3339Nano), p.Expires.Format(time.RFC3339Nano))
	}
	if got.lease.Fence <= p.Fence {
		t.Fatalf("token %d, want more than the preempted lease's %d", got.lease.Fence, p.Fence)
	}
	if _, err := l.Renew(ctx, o, ttl); err != nil {
		t.Fatalf("the other lease after the handover: %v; want it still held", err)
	}
	if err := l.Release(ctx, o); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, got.lease); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyMarksSurviveALeaderChange: marks and preemptions are raft
// writes like the queues: after the leader that committed them is killed,
// the new leader still tells the replaced waiter and the preempted holder.
func TestPolicyMarksSurviveALeaderChange(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cfg := configFor(c)
	cfg.Prefix = "/policies/failover/"
	ctx := ctxT(t, 2*time.Minute)
	// Marks last two waiter TTLs: long enough for the election.
	newL := func() *Locker { return newTestLocker(t, cfg, WithWaiterTTL(15*time.Second)) }
	hl := newL()
	h1 := mustTake(t, hl, lock.Request{Keys: []string{"replace"}, TTL: time.Minute, Owner: ownerToken(t), Holder: "h1"})
	h2 := mustTake(t, hl, lock.Request{Keys: []string{"preempt"}, TTL: time.Minute, Owner: ownerToken(t), Holder: "h2"})
	w := lock.Request{Keys: []string{"replace"}, TTL: time.Minute, Owner: ownerToken(t), Holder: "w", Queue: true}
	mustQueue(t, newL(), w)
	mustQueue(t, newL(), lock.Request{Keys: []string{"replace"}, TTL: time.Minute, Owner: ownerToken(t), Holder: "r", Queue: true, Replace: true})
	mustQueue(t, newL(), lock.Request{Keys: []string{"preempt"}, TTL: time.Minute, Owner: ownerToken(t), Holder: "p", Queue: true, Replace: true, Preempt: true})

	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	wl := newL()
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := wl.TryAcquire(ctx, w)
		return err
	}); !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("the replaced waiter after the leader change: %v; want ErrReplaced", err)
	}
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := hl.Renew(ctx, h2, time.Minute)
		return err
	}); !errors.Is(err, lock.ErrPreempted) {
		t.Fatalf("the preempted holder after the leader change: %v; want ErrPreempted", err)
	}
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := hl.Renew(ctx, h1, time.Minute)
		return err
	}); err != nil {
		t.Fatalf("the holder that was not preempted after the leader change: %v", err)
	}
	for _, h := range []*lock.Lease{h1, h2} {
		if err := hl.Release(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPreemptStopsSemaphoreSlots: an exclusive request with Preempt on a key
// whose semaphore slots are held stops every slot: the flag goes into the
// slot values with their tokens (a write changes a slot key's
// ModRevision, the token until then), so the slots keep their tokens, fail
// their renewals with ErrPreempted and release as usual.
func TestPreemptStopsSemaphoreSlots(t *testing.T) {
	m := etcdtest.Start(t)
	cfg := Config{Endpoints: []string{m.Addr}, Prefix: "/policies/slots/"}
	ctx := ctxT(t, time.Minute)
	l := newTestLocker(t, cfg)
	slot := func(name string) lock.Request {
		return lock.Request{Keys: []string{"pool"}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: name, Limit: 2}
	}
	a, b := mustTake(t, l, slot("a")), mustTake(t, l, slot("b"))
	rl := newTestLocker(t, cfg)
	r := lock.Request{Keys: []string{"pool"}, TTL: 30 * time.Second, Owner: ownerToken(t), Holder: "r", Queue: true, Replace: true, Preempt: true}
	mustQueue(t, rl, r)
	out, errs := l.RenewAll(ctx, []*lock.Lease{a, b}, 30*time.Second)
	for i, err := range errs {
		if out[i] != nil || !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
			t.Fatalf("renewal of slot %d: %+v, %v; want ErrPreempted", i, out[i], err)
		}
	}
	// Twice: the slots moved off the session keep the flag and the token.
	if _, err := l.Renew(ctx, a, 30*time.Second); !errors.Is(err, lock.ErrPreempted) {
		t.Fatalf("second renewal of slot a: %v; want ErrPreempted", err)
	}
	mustQueue(t, rl, r)
	for _, le := range []*lock.Lease{a, b} {
		if err := l.Release(ctx, le); err != nil {
			t.Fatalf("Release of slot %s: %v", le.Holder, err)
		}
	}
	got := mustTake(t, rl, r)
	if got.Fence <= max(a.Fence, b.Fence) {
		t.Fatalf("token %d, want more than the slots' %d and %d", got.Fence, a.Fence, b.Fence)
	}
	if err := rl.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}
