package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestStateWithoutWeights: holdings and waiters written before
// Request.Weight parse as one slot each, an unweighted request is written
// without a weight (as before), and a weighted one with it.
func TestStateWithoutWeights(t *testing.T) {
	const old = `{"key":"k","fence":7,"holders":[{"owner":"ab","fence":7,"limit":4,"session":"lw-s-1","acquired":1}],"queue":[{"owner":"cd","ticket":1,"since":1,"until":2}]}`
	obj := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lw-x", Annotations: map[string]string{AnnotationState: old}}}
	st, err := decode("k", obj)
	if err != nil {
		t.Fatalf("decode of a state without weights: %v", err)
	}
	if len(st.Holders) != 1 || st.Holders[0].slots() != 1 || len(st.Queue) != 1 || st.Queue[0].slots() != 1 {
		t.Fatalf("decoded %+v, want a holder and a waiter of one slot each", st)
	}
	for _, req := range []lock.Request{{Limit: 4}, {Limit: 4, Weight: 1}, {}} {
		if w := storedWeight(req); w != 0 {
			t.Errorf("weight stored for limit %d weight %d: %d, want none", req.Limit, req.Weight, w)
		}
	}
	st.Holders[0].Weight = storedWeight(lock.Request{Limit: 4, Weight: 3})
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"acquired":1,"weight":3}`) || strings.Count(string(raw), `"weight"`) != 1 {
		t.Fatalf("state written as %s, want the holding's weight of 3 and no other weight", raw)
	}
}

// TestWeightsOnAStateWrittenBeforeThem: a key's Lease written by a Locker
// that predates Request.Weight (two holders of a limit of 4 and a waiter,
// none with a weight) counts each of them as one slot: a weight-2 request
// queues behind the old waiter (2+1+2 slots do not fit in 4), the old
// waiter calling again takes its slot, the weight-2 request then waits
// for a holder to release and takes two slots. The old entries are
// written again without a weight, the new ones with theirs, and Inspect
// reports them.
func TestWeightsOnAStateWrittenBeforeThem(t *testing.T) {
	needEnv(t)
	l := newTestLocker(t, Config{Prefix: "weights-upgrade"}, WithWaiterTTL(conformanceWaiterTTL))
	ctx := context.Background()
	key := fmt.Sprintf("upgrade/%d", time.Now().UnixNano())
	// A live session for the old holdings: this Locker's own, of a lease
	// on another key.
	carrier, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key + "/session"}, TTL: time.Minute, Holder: "carrier"})
	if err != nil {
		t.Fatal(err)
	}
	ckl, err := l.getOne(ctx, "read", key+"/session")
	if err != nil {
		t.Fatal(err)
	}
	session := ckl.st.Holders[0].Session
	now := time.Now()
	raw := fmt.Sprintf(`{"key":%q,"fence":9,"holders":[`+
		`{"owner":%q,"holder":"old-1","fence":8,"limit":4,"session":%q,"acquired":%d},`+
		`{"owner":%q,"holder":"old-2","fence":9,"limit":4,"session":%q,"acquired":%d}],`+
		`"queue":[{"owner":%q,"holder":"old-waiter","ticket":1,"since":1,"until":%d}]}`,
		key, digest("old-1-"+key), session, now.UnixMilli(), digest("old-2-"+key), session, now.UnixMilli(),
		digest("old-waiter-"+key), now.Add(time.Hour).UnixMilli())
	createKeyLease(t, l, key, raw)

	wantWeights := func(holders int, want map[string]int) {
		t.Helper()
		st, err := l.Inspect(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, h := range st[0].Holders {
			got[h.Holder] = h.Weight
		}
		if st[0].HolderCount != holders || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("Inspect: %d holders, weights %v; want %d, %v", st[0].HolderCount, got, holders, want)
		}
	}
	wantWeights(2, map[string]int{"old-1": 1, "old-2": 1})

	refused := func(req lock.Request, position int) {
		t.Helper()
		_, err := l.TryAcquire(ctx, req)
		var he *lock.HeldError
		if !errors.As(err, &he) || he.Position != position {
			t.Fatalf("%s (weight %d): %v; want refused at position %d", req.Holder, req.Weight, err, position)
		}
	}
	heavy := lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "heavy", Owner: "heavy-" + key, Queue: true, Limit: 4, Weight: 2}
	refused(heavy, 1)
	kl, err := l.getOne(ctx, "read", key)
	if err != nil {
		t.Fatal(err)
	}
	if q := kl.st.Queue; len(q) != 2 || q[0].Holder != "old-waiter" || q[0].Weight != 0 || q[1].Holder != "heavy" || q[1].Weight != 2 {
		t.Fatalf("queue %+v; want the old waiter without a weight, then heavy of weight 2", q)
	}
	// Not queued, weight 2 does not fit beside the waiters' slots either.
	refused(lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "jumper", Owner: "jumper-" + key, Limit: 4, Weight: 2}, -1)

	// The old waiter, calling again as its release would (no weight).
	oldWaiter, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Holder: "old-waiter", Owner: "old-waiter-" + key, Queue: true, Limit: 4})
	if err != nil {
		t.Fatalf("the old waiter at the head, 2 of 4 slots taken: %v; want the key", err)
	}
	if oldWaiter.Fence != 10 {
		t.Fatalf("the old waiter's token %d, want 10 (after the stored 9)", oldWaiter.Fence)
	}
	refused(heavy, 0)
	if err := l.Release(ctx, &lock.Lease{Keys: []string{key}, Owner: "old-1-" + key, Fence: 8, Limit: 4}); err != nil {
		t.Fatalf("release of an old holding: %v", err)
	}
	got, err := l.TryAcquire(ctx, heavy)
	if err != nil {
		t.Fatalf("heavy at the head, 2 of 4 slots taken: %v; want the key", err)
	}
	if got.Weight != 2 {
		t.Fatalf("heavy's lease of weight %d, want 2", got.Weight)
	}
	wantWeights(3, map[string]int{"old-2": 1, "old-waiter": 1, "heavy": 2})
	kl, err = l.getOne(ctx, "read", key)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range kl.st.Holders {
		if want := map[string]int{"heavy": 2}[h.Holder]; h.Weight != want {
			t.Errorf("holding %s written with weight %d, want %d", h.Holder, h.Weight, want)
		}
	}
	if len(kl.st.Queue) != 0 {
		t.Errorf("queue %+v, want it empty", kl.st.Queue)
	}
	for _, le := range []*lock.Lease{got, oldWaiter, carrier, {Keys: []string{key}, Owner: "old-2-" + key, Fence: 9, Limit: 4}} {
		if err := l.Release(ctx, le); err != nil {
			t.Fatal(err)
		}
	}
}
