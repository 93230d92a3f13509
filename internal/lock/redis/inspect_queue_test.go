package redis

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestInspectShowsTheQueueAQuorumHolds: on Redlock-5 a waiter whose write
// missed the first node is in line on the four others; Inspect counts it
// (it showed the first node's empty queue, and a FIFO conformance run on a
// loaded machine failed on that).
func TestInspectShowsTheQueueAQuorumHolds(t *testing.T) {
	l := &Locker{nodes: make([]*node, 5), quorum: 3}
	w2 := []lock.Waiter{{Holder: "w2"}}
	views := [][]keyView{{{}}, {{waiters: w2, queued: 1}}, {{waiters: w2, queued: 1}}, {{waiters: w2, queued: 1}}, {{waiters: w2, queued: 1}}}
	st := l.keyState("k", time.Now(), views, 0)
	if st.Queued != 1 || len(st.Waiters) != 1 || st.Waiters[0].Holder != "w2" {
		t.Fatalf("Inspect = queued %d, waiters %v; want w2 in line (on 4 of 5 nodes)", st.Queued, st.Waiters)
	}
	// Only one node of five has it: not in line by a quorum.
	views = [][]keyView{{{waiters: w2, queued: 1}}, {{}}, {{}}, {{}}, {{}}}
	if st := l.keyState("k", time.Now(), views, 0); st.Queued != 0 {
		t.Fatalf("Inspect = queued %d for a waiter on 1 node of 5, want 0", st.Queued)
	}
}
