package locktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// This file holds checks that Run does not make; the stores' conformance
// tests call them beside Run.

// CheckQueueVisibility queues more waiters behind a holder than Inspect
// lists (lock.MaxInspectWaiters + 2) and checks what Inspect and the
// waiters' HeldErrors tell about the key: the holder with its fence, the
// exact queue length and every waiter's place, while the key is held, free
// but queued for, and taken by the head of the queue; and that a blocking
// Acquire that gives up says where it stood and leaves the queue.
//
// It runs for several seconds: build the lockers with a waiter TTL of at
// least 10s, so that no waiter loses its place meanwhile.
func CheckQueueVisibility(t *testing.T, newLocker func(t *testing.T) lock.Locker) {
	l, w := newLocker(t), newLocker(t)
	ctx := ctxT(t, 2*time.Minute)
	key := keys(t, 1)[0]
	h := mustAcquire(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	const n = lock.MaxInspectWaiters + 2
	waiters := make([]lock.Request, n)
	for i := range waiters {
		waiters[i] = lock.Request{Keys: []string{key}, TTL: longTTL, Holder: fmt.Sprintf("w%02d", i), Owner: owner(t), Queue: true}
		_, err := w.TryAcquire(ctx, waiters[i])
		he := wantHeldError(t, err, key)
		if he.Position != i || he.Waiters != i+1 || he.Holders != 1 || he.Holder != "holder" || he.Fence != h.Fence {
			t.Fatalf("%s joins: HeldError = %+v, want position %d of %d waiters, 1 holder: holder with fence %d", waiters[i].Holder, he, i, i+1, h.Fence)
		}
	}
	wantState := func(what string, holder string, fence int64, queued int, head int) {
		t.Helper()
		st, err := inspect1(ctx, l, key)
		if err != nil {
			t.Fatal(err)
		}
		if holder == "" {
			if st.Held || st.HolderCount != 0 || len(st.Holders) != 0 {
				t.Fatalf("%s: Inspect = %+v, want the key free (no holders)", what, st)
			}
		} else {
			if !st.Held || st.Holder != holder || st.Fence != fence || st.HolderCount != 1 || len(st.Holders) != 1 {
				t.Fatalf("%s: Inspect = %+v, want held by %s with fence %d: HolderCount 1, one entry in Holders", what, st, holder, fence)
			}
			hs := st.Holders[0]
			if hs.Holder != holder || hs.Fence != fence || hs.Acquired.IsZero() || !hs.Expires.After(hs.Acquired) {
				t.Fatalf("%s: Holders[0] = %+v, want %s with fence %d, acquired before it expires", what, hs, holder, fence)
			}
		}
		if st.Queued != queued {
			t.Fatalf("%s: Inspect.Queued = %d, want %d (waiters listed: %d)", what, st.Queued, queued, len(st.Waiters))
		}
		want := min(queued, lock.MaxInspectWaiters)
		if len(st.Waiters) != want {
			t.Fatalf("%s: Inspect lists %d waiters, want the %d oldest of %d", what, len(st.Waiters), want, queued)
		}
		for i, wt := range st.Waiters {
			if name := waiters[head+i].Holder; wt.Holder != name || wt.Since.IsZero() {
				t.Fatalf("%s: Waiters[%d] = %+v, want %s with its since time (oldest first)", what, i, wt, name)
			}
		}
	}
	wantState("12 queued behind the holder", "holder", h.Fence, n, 0)

	// A waiter calling again keeps its place; a request without Queue is
	// told how many wait.
	_, err := w.TryAcquire(ctx, waiters[5])
	if he := wantHeldError(t, err, key); he.Position != 5 || he.Waiters != n || he.Holders != 1 || he.Holder != "holder" {
		t.Fatalf("w05 calls again: HeldError = %+v, want position 5 of %d waiters, held by holder", he, n)
	}
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "jumper"})
	if he := wantHeldError(t, err, key); he.Position != -1 || he.Waiters != n || he.Holders != 1 || he.Holder != "holder" {
		t.Fatalf("an unqueued request: HeldError = %+v, want position -1, %d waiters, held by holder", he, n)
	}

	// A blocking Acquire joins at the back; when its context ends its error
	// says where it stood, and it has left the queue.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.Acquire(actx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "blocking", Queue: true})
		done <- err
	}()
	eventually(t, 20*time.Second, "the blocking Acquire is queued", func(ctx context.Context) (bool, error) {
		st, err := inspect1(ctx, l, key)
		return err == nil && st.Queued == n+1, err
	})
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire after cancel: %v, want an error matching context.Canceled", err)
	}
	if he := wantHeldError(t, err, key); he.Position != n || he.Waiters != n+1 || he.Holders != 1 || he.Holder != "holder" {
		t.Fatalf("the cancelled Acquire: HeldError = %+v, want position %d of %d waiters, held by holder", he, n, n+1)
	}
	wantState("after the blocking Acquire gave up", "holder", h.Fence, n, 0)

	// Released: the key is free but queued for.
	mustRelease(t, l, h)
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: longTTL, Holder: "jumper"})
	if he := wantHeldError(t, err, key); he.Position != -1 || he.Waiters != n || he.Holders != 0 || he.Holder != "" {
		t.Fatalf("an unqueued request on the free key: HeldError = %+v, want position -1, %d waiters, no holder", he, n)
	}
	_, err = w.TryAcquire(ctx, waiters[n-1])
	if he := wantHeldError(t, err, key); he.Position != n-1 || he.Waiters != n || he.Holders != 0 || he.Holder != "" {
		t.Fatalf("the last waiter on the free key: HeldError = %+v, want position %d of %d waiters, no holder", he, n-1, n)
	}
	wantState("released, waiters queued", "", 0, n, 0)

	// The head of the queue takes the key.
	first := mustAcquire(t, w, waiters[0])
	wantState("the head took the key", waiters[0].Holder, first.Fence, n-1, 1)

	for _, r := range waiters[1:] {
		if err := w.Dequeue(ctx, r.Keys, r.Owner); err != nil {
			t.Fatalf("Dequeue(%s): %v", r.Holder, err)
		}
	}
	mustRelease(t, w, first)
	wantState("everyone left", "", 0, 0, 0)
}
