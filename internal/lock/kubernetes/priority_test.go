package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestBoostNextToWaitersQueuedBeforeIt: a key's Lease whose waiters were
// queued by a Locker that predates Request.Boost (a ticket, no boost, no
// arrival), one of them by a clock running ten minutes ahead, takes new
// waiters by their rank next to the old ones, which rank by their ticket:
// a new waiter without a boost joins after every one of them, a boost
// passes the old waiters whose ticket is less than the boost before the
// newcomer's, and the old waiters are written again as they were.
func TestBoostNextToWaitersQueuedBeforeIt(t *testing.T) {
	needEnv(t)
	l := newTestLocker(t, Config{Prefix: "priority-upgrade"}, WithWaiterTTL(conformanceWaiterTTL))
	ctx := context.Background()
	key := fmt.Sprintf("upgrade/%d", time.Now().UnixNano())
	now := time.Now()
	until := now.Add(time.Hour).UnixMilli()
	past, ahead := now.Add(-time.Minute).UnixNano(), now.Add(10*time.Minute).UnixNano()
	raw := fmt.Sprintf(`{"key":%q,"fence":3,"queue":[{"owner":%q,"holder":"old-past","ticket":%d,"since":1,"until":%d},{"owner":%q,"holder":"old-ahead","ticket":%d,"since":1,"until":%d}]}`,
		key, digest("old-past-"+key), past, until, digest("old-ahead-"+key), ahead, until)
	createKeyLease(t, l, key, raw)
	for _, w := range []struct {
		name  string
		boost time.Duration
	}{{"plain", 0}, {"boosted", 30 * time.Second}, {"high", time.Hour}} {
		req := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: w.name, Owner: w.name + "-" + key, Queue: true, Boost: w.boost}
		if _, err := l.TryAcquire(ctx, req); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("%s behind the old waiters: %v, want ErrNotAcquired", w.name, err)
		}
	}
	kl, err := l.getOne(ctx, "read", key)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range kl.st.Queue {
		got = append(got, w.Holder)
	}
	if want := []string{"high", "old-past", "boosted", "old-ahead", "plain"}; !slices.Equal(got, want) {
		t.Fatalf("queue %q, want %q", got, want)
	}
	for _, w := range kl.st.Queue {
		switch w.Holder {
		case "old-past", "old-ahead":
			if w.Boost != 0 || (w.Ticket != past && w.Ticket != ahead) {
				t.Errorf("old waiter written again as %+v, want its ticket and no boost", w)
			}
		case "plain":
			if w.Ticket <= ahead {
				t.Errorf("new waiter's ticket %d, want one after the last queued (%d)", w.Ticket, ahead)
			}
		}
	}
	if kl.st.Arrival <= ahead {
		t.Errorf("key's last arrival %d, want it after the old waiters' tickets (%d)", kl.st.Arrival, ahead)
	}
}

// TestBoostSamePlaceOnEveryKey: a request on two keys joins both queues
// with one ticket and one boost, after the last arrival on either key, so
// that the two queues never order two waiters differently.
func TestBoostSamePlaceOnEveryKey(t *testing.T) {
	needEnv(t)
	newLocker := func() *Locker {
		return newTestLocker(t, Config{Prefix: "priority-keys"}, WithWaiterTTL(conformanceWaiterTTL))
	}
	ctx := context.Background()
	base := fmt.Sprintf("keys/%d/", time.Now().UnixNano())
	keys := []string{base + "a", base + "b"}
	l := newLocker()
	h, err := l.TryAcquire(ctx, lock.Request{Keys: keys, TTL: time.Minute, Holder: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []lock.Request{
		{Keys: keys[:1], TTL: time.Minute, Holder: "low", Owner: "low-" + base, Queue: true},
		{Keys: keys, TTL: time.Minute, Holder: "high", Owner: "high-" + base, Queue: true, Boost: time.Hour},
	} {
		if _, err := newLocker().TryAcquire(ctx, req); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("%s: %v, want ErrNotAcquired", req.Holder, err)
		}
	}
	kls, err := l.get(ctx, "read", keys)
	if err != nil {
		t.Fatal(err)
	}
	a, b := kls[0].st.Queue, kls[1].st.Queue
	if len(a) != 2 || a[0].Holder != "high" || a[1].Holder != "low" || len(b) != 1 || b[0].Holder != "high" {
		t.Fatalf("queues %+v and %+v, want high ahead of low on the first key and alone on the second", a, b)
	}
	if a[0].Ticket != b[0].Ticket || a[0].Boost != b[0].Boost || a[0].Boost != time.Hour.Microseconds() {
		t.Fatalf("high's places %+v and %+v, want one ticket and a boost of an hour on both", a[0], b[0])
	}
	if a[0].Ticket <= a[1].Ticket || kls[1].st.Arrival != a[0].Ticket {
		t.Fatalf("high's ticket %d (second key's arrival %d), want it after low's %d on both keys", a[0].Ticket, kls[1].st.Arrival, a[1].Ticket)
	}
	if err := l.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
}
