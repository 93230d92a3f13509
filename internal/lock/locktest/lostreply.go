package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// LostReplyTimeout is the operation timeout RunLostReply's newLocker must
// give the Locker it builds: long enough for the test to act between the
// store's grant and the end of the call whose reply was lost.
const LostReplyTimeout = 3 * time.Second

// RunLostReply checks what an acquisition whose reply was lost may clean up.
// newLocker(t, addr) returns a new Locker on the store at addr (host:port)
// with an operation timeout of LostReplyTimeout; upstream is the store's
// address. A Locker A dials the store through a Link that drops the
// replies: its TryAcquire runs on the store, which grants it, and the reply
// is lost. While A waits, another process of the same owner (B: a new
// operator while the old one was paused) acquires the keys, which replaces
// A's grant with a new token. The link heals, and A's call times out;
// whatever it then cleans up (its commands reach the store), it must not
// free B's lease: a third owner must be refused while B's lease
// is valid, and B must renew it. Cleaning up "whatever the owner holds"
// fails this (the third owner gets the keys).
func RunLostReply(t *testing.T, upstream string, newLocker func(t *testing.T, addr string) lock.Locker) {
	link := NewLink(t, upstream)
	a := newLocker(t, link.Addr())
	b, other := newLocker(t, upstream), newLocker(t, upstream)
	ks := keys(t, 2)
	req := lock.Request{Keys: ks, TTL: 30 * time.Second, Owner: owner(t), Holder: "paused"}
	ctx := ctxT(t, time.Minute)

	// A connection, and what the store keeps per connection or server
	// (a schema, prepared statements, loaded scripts), before the replies
	// go: the acquisition below is then one command on the link.
	warm := mustAcquire(t, a, lock.Request{Keys: keys(t, 1), TTL: req.TTL, Owner: req.Owner, Holder: "warm-up"})
	mustRelease(t, a, warm)
	heal := link.DropReplies()
	defer heal()
	aDone := make(chan error, 1)
	go func() {
		_, err := a.TryAcquire(ctx, req)
		aDone <- err
	}()
	// The store granted A: the keys are held by A's holder.
	var granted lock.KeyState
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, LostReplyTimeout, true, func(ctx context.Context) (bool, error) {
		st, err := other.Inspect(ctx, ks[:1])
		if err != nil {
			return false, nil
		}
		granted = st[0]
		return st[0].Held && st[0].Holder == req.Holder, nil
	})
	if err != nil {
		t.Fatalf("the store never showed the acquisition whose reply is dropped (last %+v): %v", granted, err)
	}
	bReq := req
	bReq.Holder = "resumed"
	second, err := b.TryAcquire(ctx, bReq)
	if err != nil {
		t.Fatalf("the same owner acquiring again from another process: %v", err)
	}
	select {
	case err := <-aDone:
		t.Fatalf("the call whose reply was lost ended (%v) before the other process had acquired: the test shows nothing; raise LostReplyTimeout", err)
	default:
	}
	if second.Fence <= granted.Fence {
		t.Fatalf("the second acquisition got fence %d, want > %d (the lost one's)", second.Fence, granted.Fence)
	}
	// The reply is gone (the link dropped it); what A sends from now on,
	// its cleanup when the call times out, reaches the store and is answered.
	heal()
	if err := <-aDone; err == nil {
		t.Fatal("TryAcquire returned a lease although its reply was dropped")
	}
	// Let A's cleanup (if any, and if run in the background) finish: A
	// answers again once it is done with the link.
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := a.Inspect(ctx, ks)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the Locker whose reply was lost does not answer after the link healed: %v", err)
	}

	_, err = other.TryAcquire(ctx, lock.Request{Keys: ks[:1], TTL: time.Second, Holder: "third"})
	if errors.Is(err, lock.ErrNotAcquired) {
		var he *lock.HeldError
		if errors.As(err, &he) && he.Fence != second.Fence {
			t.Fatalf("the third owner was refused by fence %d, want the second acquisition's %d", he.Fence, second.Fence)
		}
	} else {
		t.Fatalf("after the call whose reply was lost ended, a third owner's TryAcquire = %v while the same owner's later lease (fence %d) is valid: want it refused", err, second.Fence)
	}
	renewed, err := b.Renew(ctx, second, req.TTL)
	if err != nil {
		t.Fatalf("the later lease's renewal after the lost call's cleanup: %v", err)
	}
	mustRelease(t, b, renewed)
}
