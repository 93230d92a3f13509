package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestStateWithoutPolicyFields: a state written before Request.Replace
// and Request.Preempt parses with no marks, and a state without marks is
// written as before (no new field), so that Lockers of either version read
// it.
func TestStateWithoutPolicyFields(t *testing.T) {
	const old = `{"key":"k","fence":7,"holders":[{"owner":"ab","fence":7,"limit":1,"session":"lw-s-1","acquired":1}],"queue":[{"owner":"cd","ticket":1,"since":1,"until":2}]}`
	obj := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lw-x", Annotations: map[string]string{AnnotationState: old}}}
	st, err := decode("k", obj)
	if err != nil {
		t.Fatalf("decode of a state without the policy fields: %v", err)
	}
	if st.Replaced != nil || st.Preempted != 0 || len(st.Holders) != 1 || len(st.Queue) != 1 {
		t.Fatalf("decoded %+v, want its holder and waiter and no marks", st)
	}
	if st.preempts(st.Holders[0]) {
		t.Fatal("a holding of a state without a preemption mark is preempted")
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != old {
		t.Fatalf("state written again as\n%s\nwant it unchanged:\n%s", raw, old)
	}
}

// TestReplaceOnAStateWrittenBeforeIt: a key's Lease written by a Locker
// that predates the queue rules (a waiter at the head, no marks) takes
// them: a request with Replace drops the old waiter, takes the free key
// with the next token, and the old waiter is told it was replaced.
func TestReplaceOnAStateWrittenBeforeIt(t *testing.T) {
	needEnv(t)
	l := newTestLocker(t, Config{Prefix: "policies-upgrade"}, WithWaiterTTL(conformanceWaiterTTL))
	ctx := context.Background()
	key := fmt.Sprintf("upgrade/%d", time.Now().UnixNano())
	oldOwner := "old-owner-" + key
	until := time.Now().Add(time.Hour).UnixMilli()
	raw := fmt.Sprintf(`{"key":%q,"fence":41,"queue":[{"owner":%q,"holder":"old","ticket":1,"since":1,"until":%d}]}`, key, digest(oldOwner), until)
	createKeyLease(t, l, key, raw)
	got, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: "r-" + key, Queue: true, Replace: true})
	if err != nil {
		t.Fatalf("TryAcquire with Replace of a key whose old waiter heads the queue: %v, want the key", err)
	}
	if got.Fence != 42 {
		t.Fatalf("token %d, want 42 (after the stored 41)", got.Fence)
	}
	_, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "old", Owner: oldOwner, Queue: true})
	if !errors.Is(err, lock.ErrReplaced) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the old waiter calling again: %v, want ErrReplaced only", err)
	}
	if err := l.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}

// TestReplacedMarkLapses: a replaced owner is told so by every Locker
// (another operator, a new connection) for two waiter TTLs, and may queue
// again afterwards.
func TestReplacedMarkLapses(t *testing.T) {
	needEnv(t)
	const waiterTTL = time.Second
	cfg := Config{Prefix: "policies-lapse"}
	newLocker := func() *Locker { return newTestLocker(t, cfg, WithWaiterTTL(waiterTTL)) }
	ctx := context.Background()
	key := fmt.Sprintf("lapse/%d", time.Now().UnixNano())
	l := newLocker()
	h, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	w := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "w", Owner: "w-" + key, Queue: true}
	if _, err := newLocker().TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("w queueing: %v, want ErrNotAcquired", err)
	}
	replacedAt := time.Now()
	if _, err := newLocker().TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: "r-" + key, Queue: true, Replace: true}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("r queueing with Replace: %v, want ErrNotAcquired", err)
	}
	if _, err := newLocker().TryAcquire(ctx, w); !errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("w on a new Locker after r replaced it: %v, want ErrReplaced", err)
	}
	time.Sleep(time.Until(replacedAt.Add(2*waiterTTL + 500*time.Millisecond)))
	if _, err := newLocker().TryAcquire(ctx, w); !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrReplaced) {
		t.Fatalf("w two waiter TTLs after it was replaced: %v, want it queued again (ErrNotAcquired)", err)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestPreemptedLeaseOnARenewedSession: a preempted lease shares its
// session with a lease its holder keeps renewing. The renewals of the
// other lease no longer keep the preempted one: the preempting request
// gets its key once the preempted lease's validity has passed (not
// before), and the first failed renewal is the only one that writes more
// than the other lease's session.
func TestPreemptedLeaseOnARenewedSession(t *testing.T) {
	needEnv(t)
	hl, c := countingLocker(t, "policies-frozen")
	rl := newTestLocker(t, Config{Prefix: "policies-frozen"}, WithWaiterTTL(conformanceWaiterTTL))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ttl = 3 * time.Second
	base := fmt.Sprintf("frozen/%d/", time.Now().UnixNano())
	a, err := hl.TryAcquire(ctx, lock.Request{Keys: []string{base + "a"}, TTL: ttl, Holder: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := hl.TryAcquire(ctx, lock.Request{Keys: []string{base + "b"}, TTL: ttl, Holder: "b"})
	if err != nil {
		t.Fatal(err)
	}
	r := lock.Request{Keys: []string{base + "a"}, TTL: time.Minute, Holder: "r", Owner: "r-" + base, Queue: true, Replace: true, Preempt: true}
	if _, err := rl.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("r with Preempt: %v, want refused", err)
	}
	for round := range 2 {
		before := c.count()
		out, errs := hl.RenewAll(ctx, []*lock.Lease{a, b}, ttl)
		if !errors.Is(errs[0], lock.ErrPreempted) || errors.Is(errs[0], lock.ErrLost) {
			t.Fatalf("round %d: renewal of the preempted lease: %v, want ErrPreempted", round, errs[0])
		}
		if errs[1] != nil {
			t.Fatalf("round %d: renewal of the other lease: %v", round, errs[1])
		}
		b = out[1]
		writes := c.count() - before
		if round == 0 && writes != 3 {
			t.Fatalf("first renewal wrote %d times, want 3 (the other lease's session, the preempted lease's new session and its key)", writes)
		}
		if round == 1 && writes != 1 {
			t.Fatalf("second renewal wrote %d times, want 1 (the other lease's session): the preempted lease is frozen once", writes)
		}
	}
	sts, err := rl.Inspect(ctx, []string{base + "a"})
	if err != nil {
		t.Fatal(err)
	}
	if st := sts[0]; !st.Held || st.Fence != a.Fence || st.Expires.Before(a.Expires) {
		t.Fatalf("Inspect of the preempted key = %+v; want still held by token %d until at least %s", sts[0], a.Fence, a.Expires.Format(time.RFC3339Nano))
	}
	// The holder goes on renewing b (its session) meanwhile.
	renewing, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for renewing.Err() == nil {
			if next, err := hl.Renew(renewing, b, ttl); err == nil {
				b = next
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	got, err := rl.Acquire(ctx, r)
	took := time.Now()
	stop()
	<-done
	if err != nil {
		t.Fatalf("Acquire of the preempted key while the holder renews its other lease: %v", err)
	}
	if took.Before(a.Expires) {
		t.Fatalf("r had the key at %s, before the preempted lease's Expires %s", took.Format(time.RFC3339Nano), a.Expires.Format(time.RFC3339Nano))
	}
	if got.Fence <= a.Fence {
		t.Fatalf("r's token %d, want more than the preempted lease's %d", got.Fence, a.Fence)
	}
	if _, err := hl.Renew(ctx, b, ttl); err != nil {
		t.Fatalf("the holder's other lease after the handover: %v, want it still renewed", err)
	}
	if _, err := hl.Renew(ctx, a, ttl); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("renewal of the preempted lease after the handover: %v, want ErrLost", err)
	}
	_ = rl.Release(ctx, got)
	_ = hl.Release(ctx, b)
}

// TestPreemptedLeaseRenewedConcurrently: renewals of one preempted lease
// that race (two renewal loops of its holder) each report it preempted;
// none takes the other's move of its holdings for a loss, and the lease
// still holds its key. Its release leaves none of the sessions the
// renewals created.
func TestPreemptedLeaseRenewedConcurrently(t *testing.T) {
	needEnv(t)
	cfg := Config{Prefix: "policies-race"}
	hl := newTestLocker(t, cfg, WithWaiterTTL(conformanceWaiterTTL))
	rl := newTestLocker(t, cfg, WithWaiterTTL(conformanceWaiterTTL))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := fmt.Sprintf("race/%d", time.Now().UnixNano())
	h, err := hl.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	r := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "r", Owner: "r-" + key, Queue: true, Replace: true, Preempt: true}
	if _, err := rl.TryAcquire(ctx, r); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("r with Preempt: %v, want refused", err)
	}
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := hl.Renew(ctx, h, time.Minute)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; !errors.Is(err, lock.ErrPreempted) || errors.Is(err, lock.ErrLost) {
			t.Errorf("a racing renewal of the preempted lease: %v, want ErrPreempted only", err)
		}
	}
	sts, err := rl.Inspect(ctx, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if st := sts[0]; !st.Held || st.Fence != h.Fence {
		t.Fatalf("Inspect after the racing renewals = %+v; want still held by token %d", st, h.Fence)
	}
	if err := hl.Release(ctx, h); err != nil {
		t.Fatalf("Release of the preempted lease: %v", err)
	}
	sessions, err := hl.leases.List(ctx, metav1.ListOptions{LabelSelector: hl.selector(roleSession)})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sessions.Items {
		if frozen(s.Name) {
			t.Errorf("session %s of the preempted lease is left after its release (or a racing renewal's is left unused)", s.Name)
		}
	}
}

// TestWatchWakesOnANewReplacedMark: a waiter's watch delivers its key
// when a newer request marks waiters replaced, and not when a mark only
// lapses (nobody has anything new to learn).
func TestWatchWakesOnANewReplacedMark(t *testing.T) {
	l := &Locker{}
	names := map[string]string{"lw-k": "k"}
	last := map[string]shape{}
	var sent []string
	send := func(k string) { sent = append(sent, k) }
	version := func(st state) *coordinationv1.Lease {
		raw, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lw-k", Annotations: map[string]string{AnnotationState: string(raw)}}}
	}
	holder := []holding{{Owner: "h", Fence: 1, Limit: 1, Session: "s"}}
	old, next := mark{Owner: "a", Until: 10}, mark{Owner: "b", Until: 20}
	for _, step := range []struct {
		st   state
		want int
	}{
		{state{Key: "k", Holders: holder, Replaced: []mark{old}}, 0},
		{state{Key: "k", Holders: holder, Replaced: []mark{next}}, 1},
		{state{Key: "k", Holders: holder}, 1},
	} {
		l.event(watch.Modified, version(step.st), names, last, send)
		if len(sent) != step.want {
			t.Fatalf("after %+v: delivered %q, want %d deliveries", step.st.Replaced, sent, step.want)
		}
	}
}
