package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// Store-specific cases of the queue policies (Request.Replace and
// Request.Preempt) that the shared suite cannot reach: what the nodes keep
// across a Locker's restart, and what the TTL timers and renewal nodes do
// with a preempted lease.

// TestReplacedMarkSurvivesRestart: the waiter's Locker goes away (an operator
// restart: Close keeps the session) before a request with Replace drops it;
// the waiter, calling again through a new Locker (a new session), is told it
// was replaced: the mark is a persistent node, not the waiter's session's.
// Once the mark's time has passed, the owner queues again as usual and the
// mark is deleted.
func TestReplacedMarkSurvivesRestart(t *testing.T) {
	e, cfg, ctx := policyServer(t)
	key := testKey("restart")
	l := newTestLocker(t, cfg, WithWaiterTTL(time.Second))
	h := mustTry(t, ctx, l, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})
	w := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "w", Queue: true}
	old := newTestLocker(t, cfg, WithWaiterTTL(time.Second))
	wantRefused(t, ctx, old, w, "w joining the queue")
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	r := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "r", Queue: true, Replace: true}
	wantRefused(t, ctx, l, r, "r replacing w")
	mark := l.nodePath(key, replacedName(ownerHash(w.Owner)))
	raw := rawConn(t, e.Addrs())
	if ok, _, err := raw.Exists(mark); err != nil || !ok {
		t.Fatalf("replacement mark %s: exists %v, %v", mark, ok, err)
	}

	fresh := newTestLocker(t, cfg, WithWaiterTTL(time.Second))
	if _, err := fresh.TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w calling again through a new Locker: %v, want ErrReplaced only", err)
	}

	// Two waiter TTLs plus the skew allowance on the ensemble's clock.
	time.Sleep(2*time.Second + cfg.maxClockSkew() + 300*time.Millisecond)
	if _, err := fresh.TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("w calling again once the mark's time passed: %v, want it queued again (ErrNotAcquired)", err)
	}
	if ok, _, err := raw.Exists(mark); err != nil || ok {
		t.Fatalf("replacement mark past its time: exists %v, %v; want it deleted", ok, err)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestMarkKeepsItsWritersTTL: a mark lasts the longer of its writer's and
// the reader's two waiter TTLs, so a Locker configured with a shorter waiter
// TTL neither forgets nor deletes the mark another one wrote early.
func TestMarkKeepsItsWritersTTL(t *testing.T) {
	e := sharedServers(t, 1)
	l := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/policies"}, WithWaiterTTL(time.Second))
	skew := l.cfg.maxClockSkew().Milliseconds()
	m := &markView{ttlMs: 20_000, stat: &zk.Stat{Mtime: 1_000_000}}
	if !l.markLive(m, 1_000_000+20_000+skew) {
		t.Error("a mark written for 20s is dead to a Locker with a 1s waiter TTL before its 20s")
	}
	if l.markLive(m, 1_000_000+20_000+skew+1) {
		t.Error("a mark written for 20s is still live after 20s plus the skew allowance")
	}
	m.ttlMs = 0 // unreadable data: the reader's own two waiter TTLs
	if !l.markLive(m, 1_000_000+2_000+skew) || l.markLive(m, 1_000_000+2_000+skew+1) {
		t.Error("a mark without a TTL does not last the reader's two waiter TTLs")
	}
}

// TestReplacedRequestPreemptsNobody: a request with Preempt that a newer
// request replaces between its read and its write preempts nobody: its
// transaction checks that its own waiter node is still there.
func TestReplacedRequestPreemptsNobody(t *testing.T) {
	_, cfg, ctx := policyServer(t)
	key := testKey("race")
	hl, rl, nl := newTestLocker(t, cfg), newTestLocker(t, cfg), newTestLocker(t, cfg)
	h := mustTry(t, ctx, hl, lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "holder"})
	newer := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "newer", Queue: true, Replace: true}
	var newerErr error
	var once sync.Once
	rl.beforePolicies = func() {
		once.Do(func() { _, newerErr = nl.TryAcquire(ctx, newer) })
	}
	r := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "r", Queue: true, Replace: true, Preempt: true}
	if _, err := rl.TryAcquire(ctx, r); !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("r, replaced before its write: %v, want ErrReplaced", err)
	}
	if !errors.Is(newerErr, lock.ErrNotAcquired) {
		t.Fatalf("the newer request: %v, want ErrNotAcquired (queued)", newerErr)
	}
	if _, err := hl.Renew(ctx, h, 30*time.Second); err != nil {
		t.Fatalf("Renew of the holder: %v; a replaced request must not preempt it", err)
	}
	if err := hl.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestPreemptedLeaseEndsByItsTimer: the preemption's write changes the
// holder node, yet the acquisition's TTL timer still deletes it at the TTL,
// without any acquirer calling to take it over.
func TestPreemptedLeaseEndsByItsTimer(t *testing.T) {
	e, cfg, ctx := policyServer(t)
	key := testKey("timer")
	hl, rl := newTestLocker(t, cfg), newTestLocker(t, cfg)
	const ttl = 2 * time.Second
	h := mustTry(t, ctx, hl, lock.Request{Keys: []string{key}, TTL: ttl, Owner: mustOwner(t), Holder: "holder"})
	r := lock.Request{Keys: []string{key}, TTL: 30 * time.Second, Owner: mustOwner(t), Holder: "r", Queue: true, Replace: true, Preempt: true}
	wantRefused(t, ctx, rl, r, "r preempting")
	raw := rawConn(t, e.Addrs())
	holder := hl.holderPath(key)
	d, _, err := raw.Get(holder)
	if err != nil {
		t.Fatal(err)
	}
	if !holderDataOf(t, d).Preempted {
		t.Fatalf("holder node after the preemption: %s, want it preempted", d)
	}
	deadline := h.Expires.Add(ttl) // the timer fires at the TTL from the acquisition's start
	for {
		ok, _, err := raw.Exists(holder)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the preempted holder node is still there %v after the lease's Expires: its timer did not end it", ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if time.Now().Before(h.Expires) {
		t.Fatalf("the preempted holder node was deleted before the lease's Expires %s", h.Expires.Format(time.RFC3339Nano))
	}
	got := mustTry(t, ctx, rl, r)
	if err := rl.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// TestPreemptedLeaseLeavesItsRenewalNode: renewals of the holder's other
// leases (one write of the shared renewal node) no longer extend a preempted
// lease, and a new Locker (an operator restart) neither renews nor moves it:
// its Renew fails with ErrPreempted, its Release ends it.
func TestPreemptedLeaseLeavesItsRenewalNode(t *testing.T) {
	e, cfg, ctx := policyServer(t)
	ka, kb := testKey("a"), testKey("b")
	hl, rl := newTestLocker(t, cfg), newTestLocker(t, cfg)
	const ttl = 20 * time.Second
	owner := mustOwner(t)
	a := mustTry(t, ctx, hl, lock.Request{Keys: []string{ka}, TTL: ttl, Owner: owner, Holder: "a"})
	b := mustTry(t, ctx, hl, lock.Request{Keys: []string{kb}, TTL: ttl, Owner: owner, Holder: "b"})
	r := lock.Request{Keys: []string{kb}, TTL: ttl, Owner: mustOwner(t), Holder: "r", Queue: true, Replace: true, Preempt: true}
	wantRefused(t, ctx, rl, r, "r preempting b")
	before, err := hl.Inspect(ctx, []string{kb})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, errs := hl.RenewAll(ctx, []*lock.Lease{a}, ttl); errs[0] != nil {
		t.Fatalf("RenewAll of a: %v", errs[0])
	}
	after, err := hl.Inspect(ctx, []string{kb})
	if err != nil {
		t.Fatal(err)
	}
	if !after[0].Expires.Equal(before[0].Expires) || after[0].Fence != b.Fence {
		t.Fatalf("b after renewing a: expires %s (fence %d), want %s (fence %d): a preempted lease is not extended",
			after[0].Expires, after[0].Fence, before[0].Expires, b.Fence)
	}
	raw := rawConn(t, e.Addrs())
	_, st, err := raw.Get(hl.holderPath(kb))
	if err != nil {
		t.Fatal(err)
	}
	if err := hl.Close(); err != nil {
		t.Fatal(err)
	}

	fresh := newTestLocker(t, cfg)
	if _, err := fresh.Renew(ctx, stored(b), ttl); !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the preempted b by a new Locker: %v, want ErrPreempted only", err)
	}
	_, st2, err := raw.Get(hl.holderPath(kb))
	if err != nil {
		t.Fatal(err)
	}
	if st2.Czxid != st.Czxid || st2.Version != st.Version || st2.EphemeralOwner != st.EphemeralOwner {
		t.Fatalf("b's holder node after the refused renewal: %+v, want it untouched (%+v)", st2, st)
	}
	if _, err := fresh.Renew(ctx, stored(a), ttl); err != nil {
		t.Fatalf("Renew of a by a new Locker: %v", err)
	}
	for _, le := range []*lock.Lease{a, b} {
		if err := fresh.Release(ctx, stored(le)); err != nil {
			t.Fatalf("Release of %s by a new Locker: %v", le.Holder, err)
		}
	}
	got := mustTry(t, ctx, rl, r)
	if got.Fence <= b.Fence {
		t.Fatalf("r's token %d, want more than b's %d", got.Fence, b.Fence)
	}
	if err := rl.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// holderDataOf decodes a holder node's data.
func holderDataOf(t *testing.T, data []byte) holderData {
	t.Helper()
	var d holderData
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("holder node data %q: %v", data, err)
	}
	return d
}

// policyServer is the standalone server, the Config of these tests and a
// context for each.
func policyServer(t *testing.T) (*zktest.Ensemble, Config, context.Context) {
	t.Helper()
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	return e, Config{Servers: e.Addrs(), Root: "/policies"}, ctxT(t, 60*time.Second)
}

// mustTry makes one TryAcquire of req that must succeed.
func mustTry(t *testing.T, ctx context.Context, l *Locker, req lock.Request) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire of %s: %v", req.Holder, err)
	}
	return lease
}

// wantRefused makes one TryAcquire of req that must be refused with the
// keys busy (and, with Queue, join the queues); what names it.
func wantRefused(t *testing.T, ctx context.Context, l *Locker, req lock.Request, what string) {
	t.Helper()
	if _, err := l.TryAcquire(ctx, req); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("%s: %v, want ErrNotAcquired", what, err)
	}
}
