package hostile

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// A lock aimed at a port that speaks another protocol is a port scanner
// only if the operator shows what answered. Status and Events must say
// "not a Redis server" and name the endpoint, never echo the banner.
func TestAnotherProtocolsBannerIsNotEchoed(t *testing.T) {
	ns := tenantNamespace(t, nil)
	banners := map[string]string{
		"ssh":  "SSH-2.0-OpenSSH_9.6p1 internal-bastion-7f3a\r\n",
		"http": "HTTP/1.1 400 Bad Request\r\nServer: internal-admin-panel/2.4\r\n\r\n",
	}
	for name, banner := range banners {
		t.Run(name, func(t *testing.T) {
			srv := startFake(t, "127.0.0.1", banner, nil)
			dl := inlineLock(ns, "scan-"+name, srv.Addr)
			create(t, asTenant, dl)

			c := waitCondition(t, dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable)
			if !strings.Contains(c.Message, backend.CategoryNotRedis) || !strings.Contains(c.Message, srv.Addr) {
				t.Errorf("BackendReady says %q; want the category %s and the endpoint %s", c.Message, backend.CategoryNotRedis, srv.Addr)
			}
			for _, e := range events(t, ns, dl.Name) {
				c.Message += "\n" + e.Note
			}
			for _, leak := range []string{"OpenSSH", "bastion", "Bad Request", "admin-panel"} {
				if strings.Contains(c.Message, leak) {
					t.Errorf("the tenant can read the peer's bytes %q in status or Events:\n%s", leak, c.Message)
				}
			}
		})
	}
}

// A lock whose password goes to an address the endpoint policy denies (here
// a loopback address other than the allowed 127.0.0.1, standing for the
// operator's own pod, the metadata server or the API server) is refused
// before any connection: the listener sees nothing, the Secret stays home,
// and a Job of the lock is refused at admission with the same reason.
func TestSecretIsNotSentWhereThePolicyDenies(t *testing.T) {
	ns := tenantNamespace(t, nil)
	ctx := context.Background()
	listener := startFake(t, "127.0.0.2", "", nil)
	create(t, asTenant, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "redis-auth", Namespace: ns},
		StringData: map[string]string{"password": "the-tenants-own-password"},
	})
	dl := inlineLock(ns, "exfiltrate", listener.Addr)
	dl.Spec.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}
	create(t, asTenant, dl)

	c := waitCondition(t, dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendNotAllowed)
	if !strings.Contains(c.Message, "spec.backend.redis.endpoints[0]") || !strings.Contains(c.Message, "loopback") {
		t.Errorf("BackendReady says %q; want it to name the endpoint field and why it is denied", c.Message)
	}
	err := asTenant.Create(ctx, newJob(ns, "exfiltrate", dl.Name))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.backend.redis.endpoints[0]") {
		t.Errorf("creating a Job of the lock = %v; want it refused at admission naming the endpoint", err)
	}
	// Two resync periods after the refusal was shown: still nothing.
	waitResyncs(t, 2)
	if n, b := listener.accepted.Load(), listener.bytes.Load(); n != 0 || b != 0 {
		t.Fatalf("the denied listener accepted %d connections and received %d bytes; want none", n, b)
	}
}

// A server that declares a 1 GiB reply must cost the manager an error, not
// the allocation: otherwise one tenant's lock kills the leader, then the next
// leader, and every tenant's renewals stop.
func TestOversizedReplyDoesNotTakeTheManagerDown(t *testing.T) {
	ns := tenantNamespace(t, nil)
	srv := startFake(t, "127.0.0.1", "", func(req []byte) []byte {
		if strings.Contains(strings.ToUpper(string(req)), "HELLO") {
			return []byte("-ERR unknown command 'HELLO'\r\n") // as an old Redis: the client falls back to RESP2
		}
		return []byte("$1073741824\r\n")
	})
	before := heapSys()
	dl := inlineLock(ns, "balloon", srv.Addr)
	create(t, asTenant, dl)

	c := waitCondition(t, dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable)
	if !strings.Contains(c.Message, backend.CategoryReplyTooLarge) {
		t.Errorf("BackendReady says %q; want the category %s", c.Message, backend.CategoryReplyTooLarge)
	}
	waitResyncs(t, 2)
	// HeapSys can shrink (the runtime returns memory): only growth counts.
	if after := heapSys(); after > before && after-before > 256<<20 {
		grown := after - before
		t.Errorf("the heap grew by %d MiB while the manager talked to the server; want no reply-sized allocation", grown>>20)
	}
	// The manager is up and still serves everyone else.
	rdb := redistest.Start(t)
	other := inlineLock(tenantNamespace(t, nil), "unaffected", rdb.Addr)
	other.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	create(t, asTenant, other)
	waitCondition(t, other, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
}

func heapSys() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapSys
}

// waitResyncs lets n of the operator's resync periods pass, for assertions
// that something did NOT happen: every lock is reconciled at least once per
// period, so a change that has not shown by then is not coming.
func waitResyncs(t testing.TB, n int) {
	t.Helper()
	<-time.After(time.Duration(n) * resync)
}

// scope Global is the backend's decision, not the lock's: a Job cannot get
// Global keys that its lock is refused.
func TestGlobalScopeIsRefusedOnEveryPath(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t)
	// globalBackend creates a ClusterLockBackend on rdb that every namespace
	// may use and those labelled global-locks=yes may use with scope Global,
	// for keys with the given prefixes (none: any key).
	globalBackend := func(name string, prefixes ...string) {
		create(t, env.Client, &locksv1alpha1.ClusterLockBackend{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: locksv1alpha1.ClusterLockBackendSpec{
				Store:                        locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
				NamespaceSelector:            &metav1.LabelSelector{},
				GlobalScopeNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"global-locks": "yes"}},
				GlobalKeyPrefixes:            prefixes,
			},
		})
	}
	const backendName = "shared-global"
	globalBackend(backendName)
	onBackend := func(ns, name string, holder string) *locksv1alpha1.DistributedLock {
		dl := &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"payments/settlement"}, Scope: locksv1alpha1.ScopeGlobal,
				Backend: locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: backendName}}},
		}
		if holder != "" {
			dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: holder}
		}
		return dl
	}

	t.Run("inline endpoints, the operator allows Global nowhere", func(t *testing.T) {
		ns := tenantNamespace(t, nil)
		dl := inlineLock(ns, "global-inline", rdb.Addr)
		dl.Spec.Scope = locksv1alpha1.ScopeGlobal
		create(t, asTenant, dl)
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed)
		err := asTenant.Create(ctx, newJob(ns, "sneak", dl.Name))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.scope") {
			t.Fatalf("creating a Job of a Global lock = %v; want it refused naming spec.scope", err)
		}
	})

	t.Run("a backend that does not allow Global in the namespace", func(t *testing.T) {
		ns := tenantNamespace(t, nil)
		dl := onBackend(ns, "global-ref", "")
		create(t, asTenant, dl)
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed)
		err := asTenant.Create(ctx, newJob(ns, "sneak", dl.Name))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "globalScopeNamespaceSelector") {
			t.Fatalf("creating a Job of a Global lock = %v; want it refused naming the backend's selector", err)
		}
	})

	t.Run("a Global key outside the backend's globalKeyPrefixes", func(t *testing.T) {
		// The billing team may use Global, but only its own keys: it names
		// the ledger team's key through the billing backend.
		const billingBackend = "billing-global"
		globalBackend(billingBackend, "billing/")
		ns := tenantNamespace(t, map[string]string{"global-locks": "yes"})
		dl := onBackend(ns, "ledger-grab", "maintenance")
		dl.Spec.Keys = []string{"billing/close", "ledger/compaction"}
		dl.Spec.Backend.ClusterBackendRef.Name = billingBackend
		create(t, asTenant, dl)
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed)
		err := asTenant.Create(ctx, newJob(ns, "sneak", dl.Name))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.keys[1]") || !strings.Contains(err.Error(), "globalKeyPrefixes") {
			t.Fatalf("creating a Job of a lock on another team's Global key = %v; want it refused naming spec.keys[1] and the backend's globalKeyPrefixes", err)
		}
		for _, key := range []string{"lockwarden:{global/ledger/compaction}:lock", "lockwarden:{global/billing/close}:lock"} {
			if n, err := rdb.Client().Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Errorf("%s exists (%d, %v): the refused lock reached the store", key, n, err)
			}
		}
	})

	t.Run("a Job admitted while allowed never acquires once the namespace is not", func(t *testing.T) {
		ns := tenantNamespace(t, map[string]string{"global-locks": "yes"})
		dl := onBackend(ns, "global-window", "maintenance")
		create(t, asTenant, dl)
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
		job := newJob(ns, "settle", dl.Name)
		create(t, asTenant, job)
		cleanupJob(t, job)
		waitEvent(t, ns, job.Name, locksv1alpha1.EventWaiting)

		// The administrator takes Global away from the namespace, then the
		// maintenance window ends: the queued Job is next in line.
		var nsObj corev1.Namespace
		if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, &nsObj); err != nil {
			t.Fatal(err)
		}
		delete(nsObj.Labels, "global-locks")
		if err := env.Client.Update(ctx, &nsObj); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonScopeNotAllowed)
		patchLock(t, dl, func(dl *locksv1alpha1.DistributedLock) { dl.Spec.Holder = nil })

		note := waitEvent(t, ns, job.Name, locksv1alpha1.EventScopeNotAllowed)
		if !strings.Contains(note, "Global is not allowed") {
			t.Errorf("the Job's ScopeNotAllowed Event says %q", note)
		}
		eventually(t, 10*time.Second, "the Global key to be free (the manual holder released it)", func() (bool, string) {
			n, err := rdb.Client().Exists(ctx, "lockwarden:{global/payments/settlement}:lock").Result()
			return err == nil && n == 0, fmt.Sprint(n, err)
		})
		waitResyncs(t, 2)
		cur := getJob(t, job)
		if !ptr.Deref(cur.Spec.Suspend, false) || cur.Annotations[locksv1alpha1.AnnotationFencingToken] != "" {
			t.Fatalf("the Job started (suspend=%v, token %q) with Global keys its namespace may not use", ptr.Deref(cur.Spec.Suspend, false), cur.Annotations[locksv1alpha1.AnnotationFencingToken])
		}
	})
}

func patchLock(t testing.TB, dl *locksv1alpha1.DistributedLock, change func(*locksv1alpha1.DistributedLock)) {
	t.Helper()
	var cur locksv1alpha1.DistributedLock
	if err := asTenant.Get(context.Background(), client.ObjectKeyFromObject(dl), &cur); err != nil {
		t.Fatal(err)
	}
	before := cur.DeepCopy()
	change(&cur)
	if err := asTenant.Patch(context.Background(), &cur, client.MergeFrom(before)); err != nil {
		t.Fatalf("patch lock %s: %v", dl.Name, err)
	}
}

// What gates a Job cannot be undone by the tenant once the webhook set it:
// every edit that would start the Job without the lock, or hand its Pods a
// forged token, is refused by the admission policy.
func TestTenantCannotUngateAWaitingJob(t *testing.T) {
	ns := tenantNamespace(t, nil)
	rdb := redistest.Start(t)
	dl := inlineLock(ns, "billing", rdb.Addr)
	dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
	create(t, asTenant, dl)
	waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	job := newJob(ns, "nightly", dl.Name)
	create(t, asTenant, job)
	cleanupJob(t, job)
	waitEvent(t, ns, job.Name, locksv1alpha1.EventWaiting)

	edits := map[string]func(*batchv1.Job){
		"unsuspend":                 func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(false) },
		"remove the lock label":     func(j *batchv1.Job) { delete(j.Labels, locksv1alpha1.LabelLock) },
		"point the label elsewhere": func(j *batchv1.Job) { j.Labels[locksv1alpha1.LabelLock] = "other" },
		"mark it lost":              func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationLost] = "forged" },
		"forge a fencing token": func(j *batchv1.Job) {
			j.Annotations[locksv1alpha1.AnnotationFencingToken] = "9007199254740991"
		},
		"forge the Pods' token": func(j *batchv1.Job) {
			j.Spec.Template.Annotations = map[string]string{locksv1alpha1.AnnotationFencingToken: "9007199254740991"}
		},
		"remove the finalizer": func(j *batchv1.Job) { j.Finalizers = nil },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			cur := getJob(t, job)
			before := cur.DeepCopy()
			edit(cur)
			err := asTenant.Patch(context.Background(), cur, client.MergeFrom(before))
			if !tenancytest.DeniedByPolicy(err) {
				t.Fatalf("the tenant's edit = %v; want it refused by the admission policy", err)
			}
		})
	}
	cur := getJob(t, job)
	if !ptr.Deref(cur.Spec.Suspend, false) || cur.Labels[locksv1alpha1.LabelLock] != dl.Name {
		t.Fatalf("the Job is no longer gated: suspend=%v labels=%v", ptr.Deref(cur.Spec.Suspend, false), cur.Labels)
	}
	// Deleting the Job stays possible, and releases its place.
	if err := asTenant.Delete(context.Background(), cur); err != nil {
		t.Fatalf("the tenant cannot delete its own Job: %v", err)
	}
}

// A lease whose holder is gone or no longer gated is released within a
// resync period: removing a running Job's finalizer (what people do to a
// "stuck" object; here as an identity the policy lets through, as in a
// cluster without the policy), removing its label, or deleting a lock
// without its finalizer.
func TestOrphanedLeasesAreReleased(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t)
	keyHeld := func(ns string) func() (bool, string) {
		return func() (bool, string) {
			n, err := rdb.Client().Exists(ctx, "lockwarden:{ns/"+ns+"/ledger}:lock").Result()
			return err == nil && n == 0, fmt.Sprintf("key exists: %d %v", n, err)
		}
	}
	jobEdits := map[string]func(*batchv1.Job){
		"the Job's finalizer removed": func(j *batchv1.Job) { j.Finalizers = nil },
		"the Job's lock label removed": func(j *batchv1.Job) {
			delete(j.Labels, locksv1alpha1.LabelLock)
		},
	}
	for name, edit := range jobEdits {
		t.Run(name, func(t *testing.T) {
			ns := tenantNamespace(t, nil)
			dl := inlineLock(ns, "billing", rdb.Addr)
			create(t, asTenant, dl)
			job := newJob(ns, "nightly", dl.Name)
			create(t, asTenant, job)
			cleanupJob(t, job)
			cur := waitStarted(t, job)

			before := cur.DeepCopy()
			edit(cur)
			if err := asOperator.Patch(ctx, cur, client.MergeFrom(before)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			eventually(t, 2*resync+5*time.Second, "the orphaned lease to be released", keyHeld(ns))
			t.Logf("released %v after the edit", time.Since(start).Round(time.Millisecond))
			// And not renewed back: the key stays free past a resync.
			waitResyncs(t, 1)
			if ok, seen := keyHeld(ns)(); !ok {
				t.Fatalf("the key is held again: %s", seen)
			}
		})
	}

	t.Run("a lock deleted without its finalizer", func(t *testing.T) {
		ns := tenantNamespace(t, nil)
		dl := inlineLock(ns, "billing", rdb.Addr)
		dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
		create(t, asTenant, dl)
		waitCondition(t, dl, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
		// The tenant owns its locks: it may strip their finalizer.
		patchLock(t, dl, func(dl *locksv1alpha1.DistributedLock) { dl.Finalizers = nil })
		if err := asTenant.Delete(ctx, dl); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*resync+5*time.Second, "the lease of the deleted lock to be released", keyHeld(ns))
	})
}

// A tenant's 50 locks on addresses that never answer must not hold up
// another namespace's lock: the backends' health is checked in the
// background and a lock on a backend known to be down fails at once.
func TestBlackHoledLocksDoNotStarveOtherTenants(t *testing.T) {
	abuser := tenantNamespace(t, nil)
	for i := range 50 {
		create(t, asTenant, inlineLock(abuser, fmt.Sprintf("black-hole-%02d", i), blackHole(t)))
	}
	rdb := redistest.Start(t)
	victim := inlineLock(tenantNamespace(t, nil), "billing", rdb.Addr)
	victim.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "nightly-billing"}
	start := time.Now()
	create(t, asTenant, victim)
	waitCondition(t, victim, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	took := time.Since(start)
	t.Logf("the other namespace's lock was held %v after its creation, next to 50 black-holed locks", took.Round(time.Millisecond))
	// Generous: alone it takes well under a second; starved, each of the 50
	// locks ahead of it costs a connection timeout per resync.
	if took > 5*time.Second {
		t.Errorf("the other namespace's lock took %v to be held; the black-holed locks starve it", took)
	}
	// The black-holed locks themselves say what is wrong.
	waitCondition(t, inlineLock(abuser, "black-hole-49", ""), locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable)
}

// Credentials of an admin-owned backend stay with the administrators: the
// tenant uses the backend without being able to read its Secret, and only
// from the namespaces it selects.
func TestClusterBackendCredentialsStayWithTheAdmins(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t, redistest.WithPassword("admins-only"))
	create(t, env.Client, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-redis-auth", Namespace: tenancytest.OperatorNamespace},
		StringData: map[string]string{"password": "admins-only"},
	})
	create(t, env.Client, &locksv1alpha1.ClusterLockBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-redis"},
		Spec: locksv1alpha1.ClusterLockBackendSpec{
			Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr},
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "shared-redis-auth", Key: "password"}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "payments"}},
		},
	})
	ref := func(ns string) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"},
				Holder:  &locksv1alpha1.ManualHolder{Identity: "maintenance"},
				Backend: locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: "shared-redis"}}},
		}
	}
	allowed := ref(tenantNamespace(t, map[string]string{"team": "payments"}))
	create(t, asTenant, allowed)
	waitCondition(t, allowed, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	// The administrators see it in use and answering.
	eventually(t, 30*time.Second, "ClusterLockBackend shared-redis Ready with 1 lock", func() (bool, string) {
		var b locksv1alpha1.ClusterLockBackend
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "shared-redis"}, &b); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(b.Status.Conditions, locksv1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && b.Status.Locks == 1, fmt.Sprintf("locks=%d ready=%+v", b.Status.Locks, c)
	})

	other := ref(tenantNamespace(t, map[string]string{"team": "web"}))
	create(t, asTenant, other)
	c := waitCondition(t, other, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendNotAllowed)
	if !strings.Contains(c.Message, "namespaceSelector") {
		t.Errorf("BackendReady says %q; want it to say the backend's namespaceSelector does not select the namespace", c.Message)
	}

	var s corev1.Secret
	err := asTenant.Get(ctx, client.ObjectKey{Namespace: tenancytest.OperatorNamespace, Name: "shared-redis-auth"}, &s)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant reading the backend's Secret = %v; want Forbidden", err)
	}
	// A tenant's Secret of the same name in its own namespace is never used.
	create(t, asTenant, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-redis-auth", Namespace: allowed.Namespace},
		StringData: map[string]string{"password": "wrong"},
	})
	waitResyncs(t, 1)
	waitCondition(t, allowed, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
}

// A LockBackend is the namespace's own backend object: as trusted as inline
// endpoints. The tenant cannot use it to aim the operator somewhere the
// endpoint policy denies, and a Job of such a lock is refused; a LockBackend
// on an allowed Redis serves the namespace's locks and shows their count.
func TestTenantLockBackendFollowsTheEndpointPolicy(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, nil)
	listener := startFake(t, "127.0.0.2", "", nil)
	rdb := redistest.Start(t)
	create(t, asTenant, &locksv1alpha1.LockBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: ns},
		Spec:       locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{listener.Addr}}}},
	})
	create(t, asTenant, &locksv1alpha1.LockBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "team-redis", Namespace: ns},
		Spec:       locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}}},
	})
	onBackend := func(name, backendName string) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"},
				Holder:  &locksv1alpha1.ManualHolder{Identity: "maintenance"},
				Backend: locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: backendName}}},
		}
	}
	denied := onBackend("sneaky", "sneaky")
	create(t, asTenant, denied)
	c := waitCondition(t, denied, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendNotAllowed)
	if !strings.Contains(c.Message, "LockBackend sneaky: spec.redis.endpoints[0]") {
		t.Errorf("BackendReady says %q; want it to name the LockBackend's endpoint", c.Message)
	}
	if err := asTenant.Create(ctx, newJob(ns, "sneak", denied.Name)); !apierrors.IsInvalid(err) {
		t.Errorf("creating a Job of the lock = %v; want it refused at admission", err)
	}

	allowed := onBackend("billing", "team-redis")
	create(t, asTenant, allowed)
	waitCondition(t, allowed, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)
	eventually(t, 30*time.Second, "LockBackend team-redis Ready with 1 lock", func() (bool, string) {
		var b locksv1alpha1.LockBackend
		if err := asTenant.Get(ctx, client.ObjectKey{Namespace: ns, Name: "team-redis"}, &b); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(b.Status.Conditions, locksv1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && b.Status.Locks == 1, fmt.Sprintf("locks=%d ready=%+v", b.Status.Locks, c)
	})
	if n := listener.accepted.Load(); n != 0 {
		t.Fatalf("the denied listener accepted %d connections", n)
	}
}
