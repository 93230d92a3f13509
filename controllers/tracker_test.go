package controllers

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/watchdog"
)

func newJobTracker() *tracker {
	return newTracker(jobKind, func() client.Object { return &batchv1.Job{} })
}

// A lost lease stays reported until what shows it was written: a reconcile
// whose write failed sees it again.
func TestTrackerKeepsLostUntilCleared(t *testing.T) {
	t.Parallel()
	tr := newJobTracker()
	nn := types.NamespacedName{Namespace: "batch", Name: "report-1"}
	first := watchdog.Lost{Ref: holder.Ref{Kind: jobKind, Namespace: nn.Namespace, Name: nn.Name}, Lease: &lock.Lease{Fence: 1}, Err: lock.ErrLost}
	tr.onLost(first)

	if _, ok := tr.lostOf(nn); !ok {
		t.Fatal("lost lease not reported")
	}
	if _, ok := tr.lostOf(nn); !ok {
		t.Fatal("lost lease gone after being read once (a failed write would lose it)")
	}
	// A newer loss arrives between the read and the clear: it must survive.
	second := first
	second.Lease = &lock.Lease{Fence: 2}
	tr.onLost(second)
	tr.clearLost(nn, first)
	got, ok := tr.lostOf(nn)
	if !ok || got.Lease.Fence != 2 {
		t.Fatalf("after clearing the first loss: %+v %v, want the second (fence 2) kept", got.Lease, ok)
	}
	tr.clearLost(nn, second)
	if _, ok := tr.lostOf(nn); ok {
		t.Fatal("lost lease still reported after it was shown")
	}
}

// Each reconciler's tracker takes only its own Kind's losses, and asks for a
// reconcile of the object.
func TestTrackerRoutesLostByKind(t *testing.T) {
	t.Parallel()
	tr := newJobTracker()
	tr.onLost(watchdog.Lost{Ref: holder.Ref{Kind: lockKind, Namespace: "batch", Name: "billing"}, Lease: &lock.Lease{}})
	if _, ok := tr.lostOf(types.NamespacedName{Namespace: "batch", Name: "billing"}); ok || len(tr.notify) != 0 {
		t.Fatal("a Job tracker took a DistributedLock's lost lease")
	}
	tr.onLost(watchdog.Lost{Ref: holder.Ref{Kind: jobKind, Namespace: "batch", Name: "r-1"}, Lease: &lock.Lease{}})
	select {
	case ev := <-tr.notify:
		if ev.Object.GetNamespace() != "batch" || ev.Object.GetName() != "r-1" {
			t.Fatalf("reconcile asked for %s/%s, want batch/r-1", ev.Object.GetNamespace(), ev.Object.GetName())
		}
	default:
		t.Fatal("no reconcile asked for the Job that lost its lease")
	}
}

func TestTrackerWaitingSince(t *testing.T) {
	t.Parallel()
	tr := newJobTracker()
	nn := types.NamespacedName{Namespace: "batch", Name: "r-1"}
	if !tr.startWaiting(nn, statusNow) {
		t.Fatal("first wait not reported as first")
	}
	if tr.startWaiting(nn, statusNow.Add(5e9)) {
		t.Fatal("second wait reported as first: the Waiting Event would repeat")
	}
	if got := tr.stopWaiting(nn, statusNow.Add(9e9)); !got.Equal(statusNow) {
		t.Fatalf("waited since %v, want %v (the first attempt)", got, statusNow)
	}
	if got := tr.stopWaiting(nn, statusNow.Add(9e9)); !got.Equal(statusNow.Add(9e9)) {
		t.Fatalf("a holder that never waited waited since %v, want the fallback", got)
	}
}
