package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// lockKey is the Redis key that holds the owner token of a namespaced key.
func lockKey(namespace, key string) string {
	return "lockwarden:{ns/" + namespace + "/" + key + "}:lock"
}

func ownerToken(t *testing.T, dl *locksv1alpha1.DistributedLock, cluster, identity string) string {
	t.Helper()
	tk, err := holder.NewTokens(testOwnerKey)
	if err != nil {
		t.Fatal(err)
	}
	return tk.Owner(holder.Holder{Cluster: cluster, Namespace: dl.Namespace, Lock: dl.Name, Kind: "DistributedLock", Name: dl.Name, UID: string(dl.UID), Identity: identity})
}

func TestManualHolderHoldsAndKubectlShowsIt(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).holder("maintenance").obj())

	dl := waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	st := dl.Status
	if st.Holder == nil || st.Holder.Identity != "maintenance" || st.Holder.Kind != "DistributedLock" || st.Holder.Name != "billing" {
		t.Fatalf("status.holder = %+v, want identity maintenance of DistributedLock billing", st.Holder)
	}
	if st.FencingToken <= 0 || st.FencingToken >= 1<<53 {
		t.Fatalf("status.fencingToken = %d, want in (0, 2^53)", st.FencingToken)
	}
	// Renewed by the operator: acquired, with no fixed expiry (it would be
	// out of date after the first renewal).
	if st.AcquiredTime == nil || st.ExpireTime != nil {
		t.Fatalf("acquiredTime %v, expireTime %v: want an acquisition time and no expiry", st.AcquiredTime, st.ExpireTime)
	}
	if c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionHeld); !containsAll(c.Message, "renewed every 10s", "at most 30s") {
		t.Fatalf("Held message %q does not say how the lease is kept", c.Message)
	}
	if c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionBackendReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("BackendReady = %+v, want True", c)
	}

	// The Redis key holds this holder's owner token.
	got, err := rdb.Client().Get(context.Background(), lockKey(ns, "billing/ledger")).Result()
	if err != nil {
		t.Fatalf("GET lock key: %v", err)
	}
	if want := ownerToken(t, dl, "test", "maintenance"); redistest.LeaseOwner(got) != want {
		t.Fatalf("Redis lock key holds %q, want a lease of the holder's owner token %q", got, want)
	}

	// kubectl get dlock shows keys, holder, token, the Held reason, slots,
	// queue length and expiry: the server-side table is what kubectl prints.
	table := getTable(t, ns)
	wantCols := []string{"Name", "Keys", "Holder", "Fence", "Held", "Slots", "Queue", "Expires", "Age"}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	if fmt.Sprint(cols) != fmt.Sprint(wantCols) {
		t.Fatalf("kubectl get dlock columns = %v, want %v", cols, wantCols)
	}
	// The row has a cell per column, -o wide's included: read them by name.
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		cells[c.Name] = table.Rows[0].Cells[i]
	}
	row := table.Rows[0].Cells
	if cells["Holder"] != "maintenance" || fmt.Sprint(cells["Fence"]) != fmt.Sprint(st.FencingToken) || cells["Held"] != locksv1alpha1.ReasonAcquired ||
		cells["Slots"] != "1/1" || fmt.Sprint(cells["Queue"]) != "0" || cells["Expires"] != nil {
		t.Fatalf("kubectl get dlock row = %v, want holder maintenance, fence %d, held Acquired, slots 1/1, queue 0 and no fixed expiry", row, st.FencingToken)
	}
	if c := meta.FindStatusCondition(st.Conditions, locksv1alpha1.ConditionManualHolderHeld); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("ManualHolderHeld = %+v, want True while the manual holder holds", c)
	}
	// Events are written asynchronously, after the status.
	eventually(t, 10*time.Second, "an Acquired event", func() (bool, string) {
		return hasEvent(t, ns, "billing", locksv1alpha1.EventAcquired)
	})
}

// getTable fetches DistributedLocks as the server-side table kubectl prints.
func getTable(t *testing.T, namespace string) *metav1.Table {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	body, err := cs.CoreV1().RESTClient().Get().
		AbsPath("/apis/locks.lockwarden.io/v1alpha1/namespaces", namespace, "distributedlocks").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		DoRaw(context.Background())
	if err != nil {
		t.Fatalf("get table: %v", err)
	}
	var table metav1.Table
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&table); err != nil || len(table.Rows) == 0 {
		t.Fatalf("table: %v; body %s", err, body)
	}
	return &table
}

func TestSecondHolderWaitsThenAcquiresWithLargerToken(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("first", ns, rdb.Addr).holder("alice").obj())
	first := waitCondition(t, 15*time.Second, ns, "first", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)

	create(t, makeLock("second", ns, rdb.Addr).holder("bob").obj())
	second := waitCondition(t, 15*time.Second, ns, "second", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting)
	if second.Status.Holder == nil || second.Status.Holder.Identity != "alice" || second.Status.FencingToken != first.Status.FencingToken {
		t.Fatalf("the waiting lock's status names holder %+v with token %d, want alice with %d", second.Status.Holder, second.Status.FencingToken, first.Status.FencingToken)
	}
	// For a holder it does not renew itself, the lock shows when that lease ends unless renewed.
	if second.Status.ExpireTime == nil || !second.Status.ExpireTime.After(second.Status.AcquiredTime.Time) {
		t.Fatalf("the waiting lock's expireTime %v: want the holder's expiry, after its acquisition %v", second.Status.ExpireTime, second.Status.AcquiredTime)
	}
	if len(second.Status.Waiting) != 1 || second.Status.Waiting[0].Identity != "bob" {
		t.Fatalf("status.waiting = %+v, want bob", second.Status.Waiting)
	}

	// Removing the first holder releases its lease: the second acquires at
	// once (release notification), with a larger token.
	patchHolder(t, ns, "first", nil)
	got := waitCondition(t, 5*time.Second, ns, "second", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	if got.Status.FencingToken <= first.Status.FencingToken {
		t.Fatalf("second holder's token %d is not larger than the first's %d", got.Status.FencingToken, first.Status.FencingToken)
	}
	waitCondition(t, 5*time.Second, ns, "first", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther)
	eventually(t, 5*time.Second, "a Released event on the first lock", func() (bool, string) { return hasEvent(t, ns, "first", locksv1alpha1.EventReleased) })
}

func patchHolder(t *testing.T, namespace, name string, h *locksv1alpha1.ManualHolder) {
	t.Helper()
	// The operator writes status meanwhile: retry a conflicting update.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dl := getLock(t, namespace, name)
		dl.Spec.Holder = h
		return env.Client.Update(context.Background(), dl)
	})
	if err != nil {
		t.Fatalf("update spec.holder of %s: %v", name, err)
	}
}

func TestScopeIsolatesNamespacesUnlessGlobal(t *testing.T) {
	rdb := redistest.Start(t)
	const label = "lockwarden.io/allow-global-scope"
	startManager(t, managerOptions{policy: backend.Policy{GlobalScope: backend.GlobalScopePolicy{NamespaceLabel: label}}})
	allowed := map[string]string{label: "true"}
	nsA, nsB := newNamespace(t, allowed), newNamespace(t, allowed)

	// Namespace scope: the same key in two namespaces does not exclude.
	create(t, makeLock("a", nsA, rdb.Addr).holder("a").obj())
	create(t, makeLock("b", nsB, rdb.Addr).holder("b").obj())
	waitCondition(t, 15*time.Second, nsA, "a", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	waitCondition(t, 15*time.Second, nsB, "b", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)

	// Global scope in allowed namespaces: they exclude each other.
	create(t, makeLock("ga", nsA, rdb.Addr).keys("shared").scope(locksv1alpha1.ScopeGlobal).holder("ga").obj())
	waitCondition(t, 15*time.Second, nsA, "ga", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	create(t, makeLock("gb", nsB, rdb.Addr).keys("shared").scope(locksv1alpha1.ScopeGlobal).holder("gb").obj())
	gb := waitCondition(t, 15*time.Second, nsB, "gb", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting)
	if gb.Status.Holder == nil || gb.Status.Holder.Namespace != nsA || gb.Status.Holder.Identity != "ga" {
		t.Fatalf("gb's status names holder %+v, want ga in %s", gb.Status.Holder, nsA)
	}

	// Global scope in a namespace without the label is refused, with a message.
	nsC := newNamespace(t, nil)
	create(t, makeLock("gc", nsC, rdb.Addr).keys("shared").scope(locksv1alpha1.ScopeGlobal).holder("gc").obj())
	gc := waitCondition(t, 15*time.Second, nsC, "gc", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed)
	if c := meta.FindStatusCondition(gc.Status.Conditions, locksv1alpha1.ConditionHeld); c == nil ||
		!containsAll(c.Message, "spec.scope", nsC, label+"=true") {
		t.Fatalf("refusal message %q does not name spec.scope, the namespace and the label", c.Message)
	}
	eventually(t, 5*time.Second, "a ScopeNotAllowed event", func() (bool, string) { return hasEvent(t, nsC, "gc", locksv1alpha1.EventScopeNotAllowed) })
}

func TestDeletingALockReleasesItsKeysAtOnce(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).ttl(600).holder("maintenance").obj())
	waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)

	if err := env.Client.Delete(context.Background(), getLock(t, ns, "billing")); err != nil {
		t.Fatal(err)
	}
	c := rdb.Client()
	// With a 600 s TTL, the key disappearing within seconds means it was released.
	eventually(t, 5*time.Second, "the Redis key to be released", func() (bool, string) {
		err := c.Get(context.Background(), lockKey(ns, "billing/ledger")).Err()
		return errors.Is(err, goredis.Nil), fmt.Sprint(err)
	})
	eventually(t, 5*time.Second, "the DistributedLock to be gone", func() (bool, string) {
		var dl locksv1alpha1.DistributedLock
		err := env.Client.Get(context.Background(), nn(ns, "billing"), &dl)
		return err != nil, fmt.Sprint(err)
	})
}

// Deleting a namespace deletes its locks, each releasing its lease, without
// waiting for the namespace controller: its one DeleteCollection at a time
// lists every lock first and, at tens of thousands of locks, times out after
// a minute, again and again. envtest runs no namespace controller, so here
// the locks would stay (and their keys stay held) without the operator.
// The releases record no Events there: the API server refuses them in a
// namespace being deleted, and every refusal would be an error in the log.
func TestDeletingANamespaceDeletesItsLocks(t *testing.T) {
	rdb := redistest.Start(t)
	log := &eventLog{}
	startManager(t, managerOptions{events: log})
	ns := newNamespace(t, nil)
	other := newNamespace(t, nil)
	names := []string{"billing", "ledger", "reports"}
	for _, name := range names {
		create(t, makeLock(name, ns, rdb.Addr).keys("jobs/"+name).ttl(600).holder("maintenance").obj())
		create(t, makeLock(name, other, rdb.Addr).keys("jobs/"+name).ttl(600).holder("maintenance").obj())
	}
	for _, name := range names {
		waitCondition(t, 15*time.Second, ns, name, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
		waitCondition(t, 15*time.Second, other, name, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	}

	if err := env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	c := rdb.Client()
	eventually(t, 15*time.Second, "every lock of the deleted namespace to be gone", func() (bool, string) {
		var list locksv1alpha1.DistributedLockList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d locks left", len(list.Items))
	})
	for _, name := range names {
		// With a 600 s TTL, a key that is gone was released.
		if err := c.Get(context.Background(), lockKey(ns, "jobs/"+name)).Err(); !errors.Is(err, goredis.Nil) {
			t.Errorf("key jobs/%s of the deleted namespace: %v; want it released", name, err)
		}
		// The other namespace's locks are untouched.
		waitCondition(t, time.Second, other, name, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
		if err := c.Get(context.Background(), lockKey(other, "jobs/"+name)).Err(); err != nil {
			t.Errorf("key jobs/%s of the other namespace: %v; want it held", name, err)
		}
	}
	if n := log.count(ns, locksv1alpha1.EventAcquired); n != len(names) {
		t.Errorf("%d Acquired Events in the namespace before its deletion; want %d (one per lock)", n, len(names))
	}
	if n := log.count(ns, locksv1alpha1.EventReleased); n != 0 {
		t.Errorf("%d Released Events recorded in the namespace being deleted; want none", n)
	}
}

func TestBackendOutageIsReportedAndRecovers(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).holder("maintenance").obj())
	before := waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)

	rdb.Kill()
	// Within one renewal interval (ttl/3 = 10 s).
	waitCondition(t, 10*time.Second, ns, "billing", locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable)
	eventually(t, 5*time.Second, "a BackendUnavailable event", func() (bool, string) { return hasEvent(t, ns, "billing", locksv1alpha1.EventBackendUnavailable) })

	// Redis comes back empty (no persistence): the operator recovers by
	// itself and holds the keys again, with a larger token.
	rdb.Restart()
	waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionBackendReady, metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable)
	after := waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	if after.Status.FencingToken <= before.Status.FencingToken {
		t.Fatalf("token after the restart %d is not larger than before %d", after.Status.FencingToken, before.Status.FencingToken)
	}
	// The old lease was lost with the data, and that is reported, not hidden
	// behind the new acquisition.
	eventually(t, 5*time.Second, "a Lost event", func() (bool, string) { return hasEvent(t, ns, "billing", locksv1alpha1.EventLost) })
}

func TestManagerRestartKeepsTheLeaseWithTheSameOwner(t *testing.T) {
	rdb := redistest.Start(t)
	m1 := startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).ttl(restartTTL).holder("maintenance").obj())
	held := waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	create(t, makeLock("rival", ns, rdb.Addr).ttl(restartTTL).holder("rival").obj())
	waitCondition(t, 15*time.Second, ns, "rival", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting)

	c := rdb.Client()
	owner, err := c.Get(context.Background(), lockKey(ns, "billing/ledger")).Result()
	if err != nil {
		t.Fatal(err)
	}

	// Watch the key while the manager is down and another starts: nobody
	// else may hold it at any moment.
	stopWatch := make(chan struct{})
	seen := make(chan string, 1)
	go func() {
		defer close(seen)
		for {
			select {
			case <-stopWatch:
				return
			default:
			}
			v, err := c.Get(context.Background(), lockKey(ns, "billing/ledger")).Result()
			if err == nil && redistest.LeaseOwner(v) != redistest.LeaseOwner(owner) || errors.Is(err, goredis.Nil) {
				seen <- fmt.Sprintf("key held by %q (err %v)", v, err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	m1.stop()
	// Down until a renewal was missed, then a new manager takes over.
	ttl := restartTTL * time.Second
	waitRenewalMissed(t, c, lockKey(ns, "billing/ledger"), ttl)
	startManager(t, managerOptions{})
	// The new manager renews before the lease expires, and keeps renewing:
	// the lease outlives the one it inherited.
	waitRenewedAfterRestart(t, c, lockKey(ns, "billing/ledger"), ttl)
	deadline := time.Now().Add(ttl / 2)
	for time.Now().Before(deadline) {
		dl := getLock(t, ns, "billing")
		if c := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionHeld); c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("Held became %+v after the restart", c)
		}
		time.Sleep(500 * time.Millisecond)
	}
	close(stopWatch)
	if msg, ok := <-seen; ok {
		t.Fatalf("during the restart: %s, want %q throughout", msg, owner)
	}
	after := getLock(t, ns, "billing")
	if after.Status.FencingToken != held.Status.FencingToken {
		t.Fatalf("fencing token changed across the restart: %d -> %d", held.Status.FencingToken, after.Status.FencingToken)
	}
	waitCondition(t, 5*time.Second, ns, "rival", locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting)
}

func TestMissingSecretGivesAClearCondition(t *testing.T) {
	rdb := redistest.Start(t, redistest.WithPassword("s3cret"))
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).password("redis-auth", "password").holder("m").obj())
	dl := waitCondition(t, 15*time.Second, ns, "billing", locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonSecretNotFound)
	c := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionBackendReady)
	if !containsAll(c.Message, "spec.backend.redis.passwordSecretRef", "redis-auth", "was not found") {
		t.Fatalf("message %q does not name the field and the Secret", c.Message)
	}

	// A Secret without the key: the message names the key.
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "redis-auth", Namespace: ns}, Data: map[string][]byte{"pw": []byte("s3cret")}})
	eventually(t, 40*time.Second, "a message naming the missing key", func() (bool, string) {
		c := meta.FindStatusCondition(getLock(t, ns, "billing").Status.Conditions, locksv1alpha1.ConditionBackendReady)
		return c != nil && containsAll(c.Message, `no key "password"`), fmt.Sprint(c)
	})

	setPassword := func(v []byte) {
		t.Helper()
		var s corev1.Secret
		if err := env.Client.Get(context.Background(), nn(ns, "redis-auth"), &s); err != nil {
			t.Fatal(err)
		}
		s.Data["password"] = v
		if err := env.Client.Update(context.Background(), &s); err != nil {
			t.Fatal(err)
		}
	}
	// A password over the size limit: the message names the key and the limit.
	setPassword(make([]byte, 64<<10+1))
	eventually(t, 40*time.Second, "a message naming the key and the size limit", func() (bool, string) {
		c := meta.FindStatusCondition(getLock(t, ns, "billing").Status.Conditions, locksv1alpha1.ConditionBackendReady)
		return c != nil && c.Reason == locksv1alpha1.ReasonSecretNotFound &&
			containsAll(c.Message, "spec.backend.redis.passwordSecretRef", `redis-auth key "password" holds 65537 bytes`, "at most 64 KiB"), fmt.Sprint(c)
	})

	// The right password makes the lock work, without a restart.
	setPassword([]byte("s3cret"))
	waitCondition(t, 40*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
}

// waitRenewalMissed waits until the lease on key has less validity left than
// it has right after a renewal that was due (two thirds of ttl), minus a
// margin: a renewal was missed, so the outage being simulated is real.
func waitRenewalMissed(t *testing.T, c *goredis.Client, key string, ttl time.Duration) {
	t.Helper()
	eventually(t, ttl, "a renewal of "+key+" to be missed", func() (bool, string) {
		left, err := c.PTTL(context.Background(), key).Result()
		if err != nil {
			return false, err.Error()
		}
		return left > 0 && left < 2*ttl/3-ttl/12, fmt.Sprintf("%v left", left)
	})
}

// restartTTL is the TTL of the restart tests. The new manager must take the
// lease over within what is left of it after a missed renewal (about half
// of it): 15 s leaves a start on a loaded machine about 8 s, where 6 s left
// it 3.5 s and a slow start lost the lease in CI.
const restartTTL = 15

// waitRenewedAfterRestart waits, no longer than the lease can live after a
// missed renewal, until the lease on key was renewed again: the new
// manager took it over before it expired.
func waitRenewedAfterRestart(t *testing.T, c *goredis.Client, key string, ttl time.Duration) {
	t.Helper()
	eventually(t, 2*ttl/3, "the new manager to renew "+key+" before it expires", func() (bool, string) {
		left, err := c.PTTL(context.Background(), key).Result()
		if err != nil {
			return false, err.Error()
		}
		return left > 2*ttl/3, fmt.Sprintf("%v left", left)
	})
}
