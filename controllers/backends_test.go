package controllers

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// storeCase starts one kind of store and creates, in namespace ns, a
// LockBackend named "store" on it (with its Secret, if it needs one); setup
// returns the store's first address (storeAddr of the client's configuration).
type storeCase struct {
	name  string
	setup func(t *testing.T, ns string) (addr string)
}

var storeCases = []storeCase{
	{"redis", func(t *testing.T, ns string) string {
		s := redistest.Start(t)
		createBackend(t, ns, locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{s.Addr}}}})
		return s.Addr
	}},
	{"postgres", func(t *testing.T, ns string) string {
		s := pgtest.Start(t)
		create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: ns}, StringData: map[string]string{"password": s.Password}})
		createBackend(t, ns, locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{
				Host: s.Host, Port: int32(s.Port), Database: s.Database, User: s.User,
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "pg", Key: "password"},
			}},
		})
		return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	}},
	{"zookeeper", func(t *testing.T, ns string) string {
		e := zktest.StartEnsemble(t, 3)
		createBackend(t, ns, locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: e.Addrs(), SessionTimeoutSeconds: 20}}})
		return e.Addrs()[0]
	}},
	{"etcd", func(t *testing.T, ns string) string {
		m := etcdtest.Start(t)
		createBackend(t, ns, locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{m.Addr}}}})
		return m.Addr
	}},
}

func createBackend(t *testing.T, ns string, spec locksv1alpha1.LockBackendSpec) {
	t.Helper()
	create(t, &locksv1alpha1.LockBackend{ObjectMeta: metav1.ObjectMeta{Name: "store", Namespace: ns}, Spec: spec})
}

// TestJobGatingOnEveryStore runs the Job gate on each kind of store through
// a LockBackend: the Jobs of two CronJobs run one at a time in FIFO order
// with growing fencing tokens, each handed over on the store's release
// notification (well before the fallback requeue), and a manager restart in
// the middle of a hold keeps the holder and its token while the others wait.
// Everything above the lease API is the same code on every store.
func TestJobGatingOnEveryStore(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			// The lease must outlive the restart below: its last renewal
			// (at most ttl/3 before the stop), the downtime and the new
			// manager's start, which takes seconds on a loaded machine.
			const ttl = 9 * time.Second
			m1 := startManager(t, managerOptions{})
			ns := newNamespace(t, nil)
			c := env.Client
			sc.setup(t, ns)
			dl := makeLock("billing", ns).ttl(int32(ttl / time.Second)).obj()
			dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: "store"}}
			create(t, dl)
			report := makeCronJob(t, c, "nightly-report", ns, "billing", "")
			compact := makeCronJob(t, c, "ledger-compaction", ns, "billing", "")
			ov := watchOverlap(t, watchClient(t, env), ns)

			names := []string{"report-1", "compact-1", "report-2", "compact-2"}
			for i, n := range names {
				owner := report
				if i%2 == 1 {
					owner = compact
				}
				create(t, makeJob(n, ns).ownedBy(owner).obj())
				if i == 0 {
					waitRunning(t, c, 20*time.Second, ns, n)
					continue
				}
				// FIFO is the order of joining the queue: one at a time.
				waitQueued(t, ns, "billing", i)
			}
			eventually(t, 20*time.Second, "three waiters in the lock's status", func() (bool, string) {
				dl := getLock(t, ns, "billing")
				return len(dl.Status.Waiting) == 3, fmt.Sprintf("%+v", dl.Status.Waiting)
			})
			held := getJob(t, c, ns, names[0])

			// The manager goes away for longer than one renewal interval
			// (renewals are due every TTL/3), and a new one takes over.
			m1.stop()
			stopped := time.Now()
			time.Sleep(time.Until(stopped.Add(ttl/3 + 500*time.Millisecond)))
			startManager(t, managerOptions{})
			// Two TTLs later the first still holds with the same token, and nobody else runs.
			for deadline := time.Now().Add(2 * ttl); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
				for _, n := range names[1:] {
					if running(getJob(t, c, ns, n)) {
						t.Fatalf("%s started while %s still held the lock across the manager restart", n, names[0])
					}
				}
			}
			if got := fence(t, getJob(t, c, ns, names[0])); got != fence(t, held) {
				t.Fatalf("token changed across the restart: %d -> %d", fence(t, held), got)
			}

			var prev int64
			for i, n := range names {
				j := waitRunning(t, c, 20*time.Second, ns, n)
				for _, other := range names[i+1:] {
					if running(getJob(t, c, ns, other)) {
						t.Fatalf("%s runs before %s, which was created earlier", other, n)
					}
				}
				f := fence(t, j)
				if f <= prev {
					t.Fatalf("Job %s has fencing token %d, not larger than the previous holder's %d", n, f, prev)
				}
				if j.Annotations[locksv1alpha1.AnnotationFencingToken] != strconv.FormatInt(f, 10) {
					t.Fatalf("Job annotation token %q differs from the pod template's %d", j.Annotations[locksv1alpha1.AnnotationFencingToken], f)
				}
				prev = f
				if i+1 < len(names) {
					start := time.Now()
					complete(t, c, j)
					// Woken by the store's release notification, not by the fallback requeue.
					waitRunning(t, c, waitingRequeue-time.Second, ns, names[i+1])
					t.Logf("handover %s -> %s: %v", n, names[i+1], time.Since(start))
				}
			}
			ov.check(t)
			// The LockBackend's status says what it is and that it answers.
			eventually(t, 20*time.Second, "the LockBackend to be Ready with its type", func() (bool, string) {
				var b locksv1alpha1.LockBackend
				if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "store"}, &b); err != nil {
					return false, err.Error()
				}
				ready := false
				for _, cnd := range b.Status.Conditions {
					ready = ready || (cnd.Type == locksv1alpha1.ConditionReady && cnd.Status == metav1.ConditionTrue)
				}
				return ready && b.Status.Type != "" && b.Status.Endpoints != "" && b.Status.Locks == 1, fmt.Sprintf("%+v", b.Status)
			})
		})
	}
}
