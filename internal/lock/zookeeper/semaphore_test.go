package zookeeper

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// TestReleaseWithTheLimitChanged: a lease renewed and released with another
// limit than it was acquired with (the lock's maxHolders changed while it
// held; the operator rebuilds the lease from the lock as it is now) is still
// found, as a mutex (the holder node) and as a semaphore (a slot node), by
// the Locker that took it (what it wrote) and by another one (the read
// path, which moves the node into its session). The token still decides: a
// release or renewal with another token touches nothing.
func TestReleaseWithTheLimitChanged(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/limitchanged"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxT(t, 2*time.Minute)
	for _, c := range []struct {
		name          string
		acquired, now int
	}{{"mutex-as-semaphore", 1, 3}, {"semaphore-as-mutex", 3, 0}, {"semaphore-as-larger-semaphore", 2, 5}} {
		for _, by := range []struct {
			name string
			l    *Locker
		}{{"same-locker", l}, {"other-locker", other}} {
			t.Run(c.name+"/"+by.name, func(t *testing.T) {
				key := t.Name()
				lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: c.acquired})
				if err != nil {
					t.Fatal(err)
				}
				rebuilt := &lock.Lease{Keys: lease.Keys, Owner: lease.Owner, Fence: lease.Fence, Limit: c.now}
				wrong := *rebuilt
				wrong.Fence++
				if err := by.l.Release(ctx, &wrong); !errors.Is(err, lock.ErrNotHeld) {
					t.Fatalf("Release with another token = %v, want ErrNotHeld", err)
				}
				if _, err := by.l.Renew(ctx, &wrong, time.Minute); !errors.Is(err, lock.ErrLost) {
					t.Fatalf("Renew with another token = %v, want ErrLost", err)
				}
				if _, err := by.l.Renew(ctx, rebuilt, time.Minute); err != nil {
					t.Fatalf("Renew with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
				}
				st, err := other.Inspect(ctx, []string{key})
				if err != nil {
					t.Fatal(err)
				}
				if st[0].HolderCount != 1 || st[0].Fence != lease.Fence {
					t.Fatalf("after the renewal: %+v, want the lease (fence %d) as the one holder", st[0], lease.Fence)
				}
				if err := by.l.Release(ctx, rebuilt); err != nil {
					t.Fatalf("Release with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
				}
				if _, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute}); err != nil {
					t.Fatalf("the key after the release: %v", err)
				}
			})
		}
	}
}

// TestSlotNodes: a semaphore's holders are EPHEMERAL slot nodes named by
// their owner's hash (never the token), with the limit and the renewal node
// in their data; an owner acquiring again replaces its own slot (a new
// token), and a mutex acquisition of the same owner replaces it by the
// holder node once no other slot is live.
func TestSlotNodes(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/slotnodes"}
	l := newTestLocker(t, cfg)
	raw := rawConn(t, e.Addrs())
	ctx := ctxT(t, time.Minute)
	key := "slot-nodes"
	owner := "the-owner-token"
	req := lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: 3, Owner: owner}
	first, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	p := l.nodePath(key, slotName(ownerHash(owner)))
	b, st, err := raw.Get(p)
	if err != nil {
		t.Fatalf("read the slot node %s: %v", p, err)
	}
	var d holderData
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if st.EphemeralOwner == 0 || st.Czxid != first.Fence || d.Owner != ownerHash(owner) || d.Limit != 3 || d.Session == "" || d.TTLMs != legacyTTLMs {
		t.Fatalf("slot node: %+v with %s, want an ephemeral node created by the acquisition (fence %d) with the owner's hash, limit 3 and a renewal node", st, b, first.Fence)
	}
	if ok, _, _ := raw.Exists(l.holderPath(key)); ok {
		t.Fatal("a semaphore acquisition created the holder node")
	}
	again, err := l.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Fence <= first.Fence {
		t.Fatalf("fence %d after %d", again.Fence, first.Fence)
	}
	if _, err := l.Renew(ctx, first, time.Minute); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Renew of the replaced slot = %v, want ErrLost", err)
	}
	mutex := req
	mutex.Limit = 0
	m, err := l.TryAcquire(ctx, mutex)
	if err != nil {
		t.Fatalf("a mutex of the owner holding the only slot: %v", err)
	}
	if ok, _, _ := raw.Exists(p); ok {
		t.Fatal("the slot node stayed beside the owner's holder node")
	}
	ks, err := l.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if ks[0].HolderCount != 1 || ks[0].Fence != m.Fence {
		t.Fatalf("Inspect = %+v, want the mutex (fence %d) only", ks[0], m.Fence)
	}
	if err := l.Release(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreFaultHarnessCatchesAMutant is the negative control of the
// semaphore suites: a Locker that admits a semaphore request whatever slots
// other owners hold (Locker.ignoreSlots) must fail the semaphore fault
// run's exclusion check (more than Limit valid holders), and so must one
// that asks for one slot whatever the request's weight
// (locktest.IgnoreWeights) in weighted runs (more than Limit slots held);
// the same runs of the real Locker pass.
func TestSemaphoreFaultHarnessCatchesAMutant(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	faults := func(root string, mutant func(*Locker) lock.Locker, weights bool) locktest.Faults {
		return locktest.Faults{
			NewLocker: func(t *testing.T) lock.Locker {
				return mutant(newTestLocker(t, Config{Servers: e.Addrs(), Root: root}, WithOperationTimeout(time.Second)))
			},
			AcquireTimeout: 2 * time.Second,
			Duration:       3 * time.Second,
			Limit:          2,
			Weights:        weights,
		}
	}
	ignoreSlots := func(l *Locker) lock.Locker {
		l.ignoreSlots = true
		return l
	}
	ignoreWeights := func(l *Locker) lock.Locker { return locktest.IgnoreWeights(l) }
	asIs := func(l *Locker) lock.Locker { return l }
	err := locktest.FindViolation(t, 5, faults("/mutant", ignoreSlots, false))
	var ex *locktest.ExclusionError
	if !errors.As(err, &ex) {
		t.Fatalf("the semaphore fault harness passed a Locker that ignores the other owners' slots (%v): it cannot catch too many holders", err)
	}
	err = locktest.FindViolation(t, 5, faults("/mutant-weights", ignoreWeights, true))
	if !errors.As(err, &ex) {
		t.Fatalf("the weighted fault harness passed a Locker that counts holders instead of weights (%v): it cannot catch more slots held than the limit", err)
	}
	if err := locktest.FindViolation(t, 1, faults("/not-mutant", asIs, true)); err != nil {
		t.Fatalf("the real Locker under the control's weighted runs: %v", err)
	}
}

// TestSlotTimerAfterOtherSlots: the TTL timer of a slot ends it at its TTL
// although other owners took slots of the key since (which write the key
// node the timer's delete checks): the timer then reads the slot node and
// deletes it when it is still the one its Locker wrote. A waiter's watch
// wakes then, not when an acquirer finds the slot stale.
func TestSlotTimerAfterOtherSlots(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	cfg := Config{Servers: e.Addrs(), Root: "/slottimer"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ended := expireSignal(l)
	ctx := ctxT(t, time.Minute)
	key := "slot-timer"
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: 500 * time.Millisecond, Limit: 3, Holder: "short"}); err != nil {
		t.Fatal(err)
	}
	long, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: 3, Holder: "long"})
	if err != nil {
		t.Fatal(err)
	}
	waitSignal(t, ctx, ended, "the short slot's timer never ran")
	st, err := other.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].HolderCount != 1 || st[0].Fence != long.Fence {
		t.Fatalf("after the short slot's TTL: %+v, want only the long slot (fence %d)", st[0], long.Fence)
	}
	if err := other.Release(ctx, long); err != nil {
		t.Fatal(err)
	}
}

// TestUnconfirmedSlotTimer: the timer armed for a slot acquisition whose
// answer was lost ends the owner's slot node in this session once no
// acquisition with a known outcome holds it, although another owner took a
// slot since (the key node moved on); while the known acquisition's timer
// holds it, it is left alone.
func TestUnconfirmedSlotTimer(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, time.Minute)
	cfg := Config{Servers: e.Addrs(), Root: "/slottimer"}
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ended := expireSignal(l)
	key := "unconfirmed-slot"
	owner := "unconfirmed-slot-owner"
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: owner, Limit: 2, Holder: "lost"})
	if err != nil {
		t.Fatal(err)
	}
	hash := ownerHash(owner)
	nodes := l.lastWritten(lease.Fence, hash, lease.Keys)
	if nodes == nil {
		t.Fatal("no timer for the lease")
	}
	v := nodes[0].keyVersion
	second, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: 2, Holder: "second"})
	if err != nil {
		t.Fatal(err)
	}
	l.armUnconfirmed(hash, lease.Keys, time.Now().Add(100*time.Millisecond), []int32{v}, slotName(hash))
	waitSignal(t, ctx, ended, "the timer never ran")
	if st, err := other.Inspect(ctx, []string{key}); err != nil || st[0].HolderCount != 2 {
		t.Fatalf("Inspect while the known acquisition holds the slot: %+v, %v; want both slots", st, err)
	}
	l.disarmTimer(lease.Fence, hash)
	l.armUnconfirmed(hash, lease.Keys, time.Now().Add(100*time.Millisecond), []int32{v}, slotName(hash))
	waitSignal(t, ctx, ended, "the timer never ran")
	st, err := other.Inspect(ctx, []string{key})
	if err != nil || st[0].HolderCount != 1 || st[0].Fence != second.Fence {
		t.Fatalf("Inspect after the unconfirmed timer: %+v, %v; want only the second slot (fence %d)", st, err, second.Fence)
	}
}
