package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// writesDuring returns how many write transactions the ensemble committed
// while fn ran: the gap between the zxids of two writes of the ticket node
// around it, less the second one. The servers of these tests serve one test
// at a time, and a test's Lockers write nothing by themselves before a TTL.
func writesDuring(t *testing.T, ctx context.Context, l *Locker, fn func()) int64 {
	t.Helper()
	before, _, err := l.serverNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn()
	after, _, err := l.serverNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return after - before - 1
}

// TestRenewAllWritesOncePerRound: a watchdog round over many leases of one
// TTL is one write (the renewal node) whatever the number of leases; the
// control renews by the read path, one write per lease, so the count can fail.
func TestRenewAllWritesOncePerRound(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	const n = 40
	for _, tc := range []struct {
		name     string
		readPath bool
		want     int64
	}{
		{"renewal node", false, 1},
		{"read path (control)", true, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t, 60*time.Second)
			l := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/renewal-writes"})
			l.noRenewalNode = tc.readPath
			leases := make([]*lock.Lease, n)
			for i := range leases {
				var err error
				leases[i], err = l.TryAcquire(ctx, lock.Request{Keys: []string{testKey(fmt.Sprint("w", i))}, TTL: time.Minute, Owner: mustOwner(t), Holder: "job"})
				if err != nil {
					t.Fatal(err)
				}
			}
			for round := range 2 {
				var out []*lock.Lease
				var errs []error
				writes := writesDuring(t, ctx, l, func() { out, errs = l.RenewAll(ctx, leases, time.Minute) })
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("round %d: RenewAll: %v", round, err)
				}
				if writes != tc.want {
					t.Fatalf("round %d: RenewAll of %d leases made %d write transactions, want %d", round, n, writes, tc.want)
				}
				for i, r := range out {
					if r.Fence != leases[i].Fence || !r.Expires.After(leases[i].Expires) {
						t.Fatalf("round %d: lease %d renewed as %+v, was %+v", round, i, r, leases[i])
					}
				}
				leases = out
			}
			other := newTestLocker(t, Config{Servers: e.Addrs(), Root: "/renewal-writes"})
			for _, lease := range leases {
				assertHeldBy(t, ctx, other, lease.Keys[0], lease)
			}
		})
	}
}

// takeoverDuringRenewal: a's lease (TTL 1s, a's clock frozen so its own
// timer never ends it) is past its TTL on the ensemble's clock; b tries to
// take the key over, and between b's read and b's transaction a renews the
// lease on its renewal node. It returns a's renewal and b's last answer.
func takeoverDuringRenewal(t *testing.T, mutant bool) (renewed *lock.Lease, taken *lock.Lease, err error) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/renewal-race"}
	a := newTestLocker(t, cfg, WithClock(testingclock.NewFakeClock(time.Now())))
	b := newTestLocker(t, cfg)
	b.skipRenewalCheck = mutant
	key := testKey("race")
	lease, aerr := a.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Second, Owner: mustOwner(t), Holder: "a"})
	if aerr != nil {
		t.Fatal(aerr)
	}
	var fired atomic.Bool
	var renewErr error
	b.beforeTake = func() {
		if fired.Swap(true) {
			return
		}
		out, errs := a.RenewAll(ctx, []*lock.Lease{lease}, time.Second)
		renewed, renewErr = out[0], errs[0]
	}
	// The lease passes its TTL on the ensemble's clock a second or two
	// from now (TTL, drift, skew allowance); the bound keeps a failing
	// run short.
	perr := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		taken, err = b.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "b"})
		return err == nil || fired.Load(), nil
	})
	if perr != nil {
		t.Fatalf("b never reached its takeover transaction: %v (last answer %v)", perr, err)
	}
	if renewErr != nil {
		t.Fatalf("a's renewal: %v", renewErr)
	}
	return renewed, taken, err
}

// TestTakeoverChecksTheRenewalNode: an acquirer that judged a lease past its
// TTL by its renewal node checks that node's version in its transaction, so
// a renewal in between makes the takeover fail: the renewed lease keeps the
// key.
func TestTakeoverChecksTheRenewalNode(t *testing.T) {
	renewed, taken, err := takeoverDuringRenewal(t, false)
	if taken != nil {
		t.Fatalf("b took the key (fence %d) right after a renewed its lease (fence %d): two valid holders", taken.Fence, renewed.Fence)
	}
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Fence != renewed.Fence {
		t.Fatalf("b's takeover: %v; want the key held by the renewed lease (fence %d)", err, renewed.Fence)
	}
}

// TestTakeoverWithoutTheCheckIsCaught is the negative control of
// TestTakeoverChecksTheRenewalNode: with the check left out, the same
// schedule gives the key to b while a's renewal says a holds it.
func TestTakeoverWithoutTheCheckIsCaught(t *testing.T) {
	renewed, taken, err := takeoverDuringRenewal(t, true)
	if err != nil || taken == nil {
		t.Fatalf("the mutant's takeover: %v; the race test cannot fail", err)
	}
	if renewed == nil {
		t.Fatal("a's renewal did not succeed: the race test proves nothing")
	}
}

// TestLeaseOfAnEarlierReleaseMovesOntoTheRenewalNode: a holder node as an
// earlier release wrote it (its own TTL, no renewal node) is renewed by the
// read path and moved onto the renewal node (keeping its token); the next
// round is one write. Holder nodes on a renewal node carry a ttlMs that an
// earlier release, judging by the holder node alone, never sees pass.
func TestLeaseOfAnEarlierReleaseMovesOntoTheRenewalNode(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/renewal-legacy"}
	l := newTestLocker(t, cfg)
	raw := rawConn(t, e.Addrs())
	key := testKey("legacy")
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	read := func() holderData {
		t.Helper()
		b, _, err := raw.Get(l.holderPath(key))
		if err != nil {
			t.Fatal(err)
		}
		var d holderData
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := read()
	if d.Session == "" || d.TTLMs != legacyTTLMs {
		t.Fatalf("holder node after an acquisition: %+v; want it on a renewal node with ttlMs %d", d, legacyTTLMs)
	}
	if end := time.UnixMilli(time.Now().UnixMilli() + d.TTLMs); end.Before(time.Now().AddDate(30, 0, 0)) {
		t.Fatalf("an earlier release would end the lease at %v", end)
	}
	// What an earlier release's renewal left.
	legacy := holderData{Owner: d.Owner, Holder: d.Holder, TTLMs: time.Minute.Milliseconds()}
	if _, err := raw.Set(l.holderPath(key), mustJSON(legacy), -1); err != nil {
		t.Fatal(err)
	}
	out, errs := l.RenewAll(ctx, []*lock.Lease{lease}, time.Minute)
	if errs[0] != nil || out[0].Fence != lease.Fence {
		t.Fatalf("RenewAll of the lease as an earlier release left it: %+v, %v", out[0], errs[0])
	}
	if d := read(); d.Session == "" || d.TTLMs != legacyTTLMs || d.Owner != legacy.Owner {
		t.Fatalf("holder node after the renewal: %+v; want it moved onto the renewal node", d)
	}
	if w := writesDuring(t, ctx, l, func() { _, errs = l.RenewAll(ctx, out, time.Minute) }); errs[0] != nil || w != 1 {
		t.Fatalf("the next round: %v, %d writes; want one", errs[0], w)
	}
}

// TestUnrenewedLeaseEndsWhileOthersAreRenewed: the renewal node keeps every
// lease on it alive for acquirers, but a lease the caller stops renewing
// still ends at its TTL (its timer), while the one it renews stays.
func TestUnrenewedLeaseEndsWhileOthersAreRenewed(t *testing.T) {
	e := sharedServers(t, 1)
	logsOnFailure(t, e)
	ctx := ctxT(t, 60*time.Second)
	cfg := Config{Servers: e.Addrs(), Root: "/renewal-unrenewed"}
	l := newTestLocker(t, cfg)
	other := newTestLocker(t, cfg)
	const ttl = 500 * time.Millisecond
	dropped, err := l.TryAcquire(ctx, lock.Request{Keys: []string{testKey("dropped")}, TTL: ttl, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := l.TryAcquire(ctx, lock.Request{Keys: []string{testKey("kept")}, TTL: ttl, Owner: mustOwner(t), Holder: "job"})
	if err != nil {
		t.Fatal(err)
	}
	// Renew kept every 100ms until dropped is free; the bound only keeps a
	// failing run short.
	perr := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		out, errs := l.RenewAll(ctx, []*lock.Lease{kept}, ttl)
		if errs[0] != nil {
			return false, errs[0]
		}
		kept = out[0]
		st, err := other.Inspect(ctx, dropped.Keys)
		return err == nil && !st[0].Held, nil
	})
	if perr != nil {
		t.Fatalf("the lease no longer renewed did not end at its TTL while another was renewed: %v", perr)
	}
	assertHeldBy(t, ctx, other, kept.Keys[0], kept)
}

// TestSessionNames: a renewal node's name carries its TTL back, for any
// session id; names this package does not write give no TTL (such a holder
// is never taken over at a TTL).
func TestSessionNames(t *testing.T) {
	for _, sid := range []int64{1, 0x100038784710000, -1} {
		name := sessionName(sid, 1500*time.Millisecond)
		if got, ok := parseSessionName(name); !ok || got != 1500 || len(name) != len("s-")+16+1+4 {
			t.Errorf("parseSessionName(%q) = %d, %v; want 1500", name, got, ok)
		}
	}
	for _, name := range []string{"", "s-", "s-0123456789abcdef", "s-0123456789abcdef-0", "s-0123456789abcdef--5",
		"s-0123456789abcdeg-10", "x-0123456789abcdef-10", "s-0123456789abcdef-10/../x", "s-0123456789abcdef-1099511627776"} {
		if ttl, ok := parseSessionName(name); ok {
			t.Errorf("parseSessionName(%q) = %d, true; want not ok", name, ttl)
		}
	}
}
