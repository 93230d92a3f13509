package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestChangesMadeInRedisShowWithinOneResync: a holder that takes the keys
// outside this operator (another cluster: no release message announces
// it), and keys deleted by hand in Redis, show in status within one resync
// period.
func TestChangesMadeInRedisShowWithinOneResync(t *testing.T) {
	const resync = 2 * time.Second
	rdb := redistest.Start(t)
	startManager(t, managerOptions{resync: resync})
	ns := newNamespace(t, nil)
	create(t, makeLock("ledger", ns, rdb.Addr).keys("ledger").obj())
	waitCondition(t, 15*time.Second, ns, "ledger", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree)

	other, err := redislock.New(redislock.Config{Addrs: []string{rdb.Addr}, Prefix: backend.KeyPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	elsewhere := holder.Holder{Cluster: "other", Namespace: ns, Lock: "ledger", Kind: jobKind, Name: "nightly", UID: "u1", Identity: "other/nightly"}
	start := time.Now()
	lease, err := other.TryAcquire(context.Background(), lock.Request{Keys: []string{backend.EngineKey(ns, locksv1alpha1.ScopeNamespace, "ledger")}, TTL: time.Minute, Holder: elsewhere.Encode()})
	if err != nil {
		t.Fatal(err)
	}
	// Within one period, plus the reconcile and a loaded machine's slack.
	dl := waitCondition(t, resync+5*time.Second, ns, "ledger", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther)
	t.Logf("a holder elsewhere showed after %v", time.Since(start).Round(time.Millisecond))
	if dl.Status.Holder == nil || dl.Status.Holder.Identity != "other/nightly" || dl.Status.FencingToken != lease.Fence {
		t.Fatalf("status holder %+v, token %d; want other/nightly with token %d", dl.Status.Holder, dl.Status.FencingToken, lease.Fence)
	}

	// Deleted by hand: no release message either.
	start = time.Now()
	if err := rdb.Client().Del(context.Background(), lockKey(ns, "ledger")).Err(); err != nil {
		t.Fatal(err)
	}
	dl = waitCondition(t, resync+5*time.Second, ns, "ledger", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree)
	t.Logf("keys deleted by hand showed after %v", time.Since(start).Round(time.Millisecond))
	if dl.Status.Holder != nil {
		t.Fatalf("status holder %+v after the keys were deleted", dl.Status.Holder)
	}
}

// TestResyncInspectsABackendsLocksInOneCall: the status resync reads the
// keys of all the locks of one backend together, one script call per
// period (and one round trip), not one per lock; locks that did not change
// are not reconciled (no further script calls, no status writes).
func TestResyncInspectsABackendsLocksInOneCall(t *testing.T) {
	const (
		locks  = 50
		resync = time.Second
		window = 4 * time.Second
	)
	rdb := redistest.Start(t)
	startManager(t, managerOptions{resync: resync})
	ns := newNamespace(t, nil)
	for i := range locks {
		create(t, makeLock(fmt.Sprintf("l%02d", i), ns, rdb.Addr).keys(fmt.Sprintf("key-%02d", i)).obj())
	}
	for i := range locks {
		waitCondition(t, 30*time.Second, ns, fmt.Sprintf("l%02d", i), locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree)
	}
	// Let the last reconciles end.
	rc := rdb.Client()
	settled := scriptCalls(t, rc)
	_ = wait.PollUntilContextTimeout(context.Background(), resync/2, 10*time.Second, false, func(context.Context) (bool, error) {
		n := scriptCalls(t, rc)
		done := n-settled <= 1
		settled = n
		return done, nil
	})

	before := scriptCalls(t, rc)
	time.Sleep(window) // a measured window: the count over it is what is asserted, not a wait for a result
	calls := scriptCalls(t, rc) - before
	t.Logf("%d locks, resync %v: %d script calls in %v", locks, resync, calls, window)
	// One call per period (4, or 5 with a period's call on each edge), where
	// a call per lock and period would be 200.
	if periods := int64(window/resync) + 1; calls > periods {
		t.Errorf("%d script calls in %v for %d locks with a resync every %v, want at most %d (one per period)", calls, window, locks, resync, periods)
	}
	if calls == 0 {
		t.Errorf("no script call in %v: the locks are not resynced", window)
	}
}

// scriptCalls reads how many scripts (EVALSHA, EVAL) a Redis server ran.
func scriptCalls(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		for _, cmd := range []string{"evalsha", "eval"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				n, err := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				total += n
			}
		}
	}
	return total
}

// failingLocker is a backend that does not answer.
type failingLocker struct{ lock.Locker }

func (failingLocker) Inspect(context.Context, []string) ([]lock.KeyState, error) {
	return nil, lock.ErrBackendUnavailable
}

// TestResyncDoesNotReconcileEveryLockOfASlowBackend: a backend that does
// not answer one resync (slow, or down: its health check reports that) is
// asked again at the next, not answered with a reconcile of each of its
// locks; a lock it failed to answer for two resyncs in a row is reconciled.
func TestResyncDoesNotReconcileEveryLockOfASlowBackend(t *testing.T) {
	t.Parallel()
	table := newResyncTable()
	for i := range 3 {
		table.set(nn("ns", fmt.Sprintf("l%d", i)), resyncEntry{locker: failingLocker{}, keys: []string{fmt.Sprintf("k%d", i)}})
	}
	var enqueued []string
	s := &statusResync{table: table, interval: time.Minute, enqueue: func(_ context.Context, n types.NamespacedName) {
		enqueued = append(enqueued, n.Name)
	}}
	s.resync(context.Background())
	if len(enqueued) != 0 {
		t.Fatalf("after one resync the backend did not answer: %v reconciled, want none", enqueued)
	}
	s.resync(context.Background())
	if len(enqueued) != 3 {
		t.Fatalf("after two resyncs in a row the backend did not answer: %v reconciled, want all 3", enqueued)
	}
}
