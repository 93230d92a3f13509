package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// peakRSSBound is what the whole test process (manager, webhook, the test's
// own clients and fake servers) may reach while 16 hostile backends attack:
// well under the chart's 512Mi limit. One reply allocated as declared would
// pass it alone (the smallest payload declares 64 MiB, most 1 GiB or more).
const peakRSSBound = 384 << 20

// hostileBackend is a tenant's LockBackend on a server that lies.
type hostileBackend struct {
	name    string
	handle  func(c net.Conn)
	backend func(srv *rawserver.Server) locksv1alpha1.LockBackendSpec
	// shows is the error category the manager must show for it; "": any
	// refusal (a reply within the bounds whose data never comes times out).
	shows string
}

func redisOn(srv *rawserver.Server) locksv1alpha1.LockBackendSpec {
	return locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{srv.Addr}}}}
}

func postgresOn(srv *rawserver.Server) locksv1alpha1.LockBackendSpec {
	return locksv1alpha1.LockBackendSpec{
		Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{
			Host: srv.Host, Port: int32(srv.Port), Database: "locks", User: "tenant"}},
	}
}

func zookeeperOn(srv *rawserver.Server) locksv1alpha1.LockBackendSpec {
	return locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{srv.Addr}}}}
}

func etcdOn(srv *rawserver.Server) locksv1alpha1.LockBackendSpec {
	return locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{srv.Addr}}}}
}

// zkLying answers a good connect, then every request for the lock's nodes
// with a few bytes that declare a huge field: with children, every list of
// children as 2^32-1 names; otherwise every node's data as 2 GiB. Opcodes
// are ZooKeeper's: 4 getData, 8 getChildren, 9 sync, 12 getChildren2.
func zkLying(children bool) func(c net.Conn) {
	stat := make([]byte, 68)
	return rawserver.ZooKeeper(rawserver.ZKConnectResponse(4000, 16), func(op int32) []byte {
		switch {
		case op == 9:
			return append(binary.BigEndian.AppendUint32(nil, 1), '/')
		case children && (op == 8 || op == 12):
			return append(binary.BigEndian.AppendUint32(nil, 0xffffffff), stat...)
		case !children && op == 4:
			return append(binary.BigEndian.AppendUint32(nil, 0x7fffffff), stat...)
		}
		return stat
	})
}

// zkConnect answers the connect request with a response whose password
// declares passwdLen bytes, and every later request with an empty stat.
func zkConnect(passwdLen uint32) func(c net.Conn) {
	return rawserver.ZooKeeper(rawserver.ZKConnectResponse(4000, passwdLen), func(int32) []byte { return make([]byte, 68) })
}

// The payloads of the issue, four per protocol.
const tooLarge = backend.CategoryReplyTooLarge

var hostileBackends = []hostileBackend{
	{"redis-resp3-map", rawserver.Repeat(rawserver.RedisMapAndBulk), redisOn, backend.CategoryNotRedis},
	{"redis-long-array", rawserver.Repeat(rawserver.RedisLongArray), redisOn, tooLarge},
	{"redis-array-of-bulks", rawserver.Repeat(rawserver.RedisArrayOfBulks), redisOn, ""},
	{"redis-1gib-bulk", rawserver.Repeat("$1073741824\r\n"), redisOn, tooLarge},
	{"postgres-1gib", rawserver.PostgresAnnouncing(1 << 30), postgresOn, tooLarge},
	{"postgres-2gib", rawserver.PostgresAnnouncing(0x7fffffff), postgresOn, tooLarge},
	{"postgres-4gib", rawserver.PostgresAnnouncing(0xffffffff), postgresOn, ""}, // a negative length to pgx: Unavailable
	{"postgres-64mib", rawserver.PostgresAnnouncing(64 << 20), postgresOn, tooLarge},
	{"zookeeper-1gib-passwd", zkConnect(1 << 30), zookeeperOn, tooLarge},
	{"zookeeper-2gib-passwd", zkConnect(0x7fffffff), zookeeperOn, tooLarge},
	{"zookeeper-children", zkLying(true), zookeeperOn, tooLarge},
	{"zookeeper-data", zkLying(false), zookeeperOn, ""}, // the lock path reads no node data this way: Unavailable
	{"etcd-1gib-message", rawserver.GRPC(0, 0, rawserver.GRPCAnnouncing1GiB, nil), etcdOn, tooLarge},
	{"etcd-8mib-header", rawserver.GRPC(8<<20, 1, nil, nil), etcdOn, ""},   // gRPC retries the connection until the call times out: Timeout
	{"etcd-4096-headers", rawserver.GRPC(256, 4096, nil, nil), etcdOn, ""}, // as above
	{"etcd-header-then-1gib", rawserver.GRPC(1<<10, 8, rawserver.GRPCAnnouncing1GiB, nil), etcdOn, tooLarge},
}

// One tenant points 16 LockBackends, with a lock on each, at servers of
// every protocol that announce replies of up to 4 GiB, and 16 inline locks
// at one lying Redis (databases 0 to 15). The shared manager
// must refuse each reply without allocating it, stay the leader (no
// restart), stay under a stated memory bound, and hand another tenant's lock
// from Job to Job about as fast as when nobody attacks.
func TestSixteenHostileBackendsAtOnce(t *testing.T) {
	rdb := redistest.Start(t)
	victimNS := tenantNamespace(t, nil)
	victim := inlineLock(victimNS, "billing", rdb.Addr)
	create(t, asTenant, victim)

	leaseBefore := leaderLease(t)
	resetPeakRSS(t)

	quiet := handovers(t, victim, "quiet", 5)

	abuser := tenantNamespace(t, nil)
	servers := make([]*rawserver.Server, len(hostileBackends))
	for i, hb := range hostileBackends {
		servers[i] = rawserver.Start(t, hb.handle)
		create(t, asTenant, &locksv1alpha1.LockBackend{
			ObjectMeta: metav1.ObjectMeta{Name: hb.name, Namespace: abuser},
			Spec:       hb.backend(servers[i]),
		})
		dl := &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: hb.name, Namespace: abuser},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"},
				Holder:  &locksv1alpha1.ManualHolder{Identity: "maintenance"},
				Backend: locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: hb.name}}},
		}
		create(t, asTenant, dl)
	}
	// And 16 inline locks on one server, databases 0 to 15: each its own
	// client and pool.
	inline := rawserver.Start(t, rawserver.Repeat("$1073741824\r\n"))
	servers = append(servers, inline)
	for db := range int32(16) {
		dl := inlineLock(abuser, fmt.Sprintf("inline-db-%02d", db), inline.Addr)
		dl.Spec.Backend.Redis.DB = db
		dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance"}
		create(t, asTenant, dl)
	}
	// Every hostile backend is refused as such: on the LockBackend's Ready
	// condition (health checks) or on its lock (the calls a lock makes).
	for i, hb := range hostileBackends {
		var shown string
		eventually(t, 60*time.Second, hb.name+" refused", func() (bool, string) {
			ready, lock := backendMessage(t, abuser, hb.name), lockBackendMessage(t, abuser, hb.name)
			shown = ready + " | " + lock
			return strings.HasPrefix(ready, "False") || strings.HasPrefix(lock, "False"), shown
		})
		if hb.shows != "" {
			// The category may take another health check to show.
			err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				shown = backendMessage(t, abuser, hb.name) + " | " + lockBackendMessage(t, abuser, hb.name)
				return strings.Contains(shown, hb.shows), nil
			})
			if err != nil {
				t.Errorf("%s is refused, but not as %s: %s", hb.name, hb.shows, shown)
			}
		}
		t.Logf("%-26s %3d connections; LockBackend | lock: %s", hb.name, servers[i].Accepted(), shown)
	}
	// None of them ever held a lease.
	for _, hb := range hostileBackends {
		if c, _ := condition(t, client.ObjectKey{Namespace: abuser, Name: hb.name}, locksv1alpha1.ConditionHeld); c != nil && c.Status == metav1.ConditionTrue {
			t.Errorf("the lock on %s is Held: %s", hb.name, c.Message)
		}
	}

	for db := range 16 {
		name := fmt.Sprintf("inline-db-%02d", db)
		eventually(t, 60*time.Second, name+" shown as "+backend.CategoryReplyTooLarge, func() (bool, string) {
			shown := lockBackendMessage(t, abuser, name)
			return strings.Contains(shown, backend.CategoryReplyTooLarge), shown
		})
	}
	t.Logf("%-26s %d connections", "inline db 0..15", inline.Accepted())

	attacked := handovers(t, victim, "attacked", 5)
	// The attack goes on: every health check reconnects. Two more resyncs
	// of it before the memory is read.
	waitResyncs(t, 2)
	peak := peakRSS(t)
	var conns int64
	for _, s := range servers {
		conns += s.Accepted()
	}
	t.Logf("victim handover p50: %v quiet, %v under attack (5 handovers each)", quiet, attacked)
	t.Logf("peak RSS of the test process (manager included) since before the attack: %d MiB; the hostile servers accepted %d connections", peak>>20, conns)
	if peak > peakRSSBound {
		t.Errorf("peak RSS %d MiB; want at most %d MiB", peak>>20, peakRSSBound>>20)
	}
	leaseAfter := leaderLease(t)
	if ptr.Deref(leaseAfter.Spec.HolderIdentity, "") != ptr.Deref(leaseBefore.Spec.HolderIdentity, "") ||
		ptr.Deref(leaseAfter.Spec.LeaseTransitions, 0) != ptr.Deref(leaseBefore.Spec.LeaseTransitions, 0) {
		t.Errorf("the leader changed during the attack: holder %q -> %q, transitions %d -> %d",
			ptr.Deref(leaseBefore.Spec.HolderIdentity, ""), ptr.Deref(leaseAfter.Spec.HolderIdentity, ""),
			ptr.Deref(leaseBefore.Spec.LeaseTransitions, 0), ptr.Deref(leaseAfter.Spec.LeaseTransitions, 0))
	}
	if !leaseAfter.Spec.RenewTime.After(leaseBefore.Spec.RenewTime.Time) {
		t.Errorf("the leader stopped renewing its Lease during the attack (renewed %v before, %v after)", leaseBefore.Spec.RenewTime, leaseAfter.Spec.RenewTime)
	}
}

// handovers creates n+1 Jobs of the lock and deletes each running one in
// turn, timing how long the next takes to start with its fencing token (a
// larger one each time), then deletes the last; it returns the median.
func handovers(t *testing.T, dl *locksv1alpha1.DistributedLock, phase string, n int) time.Duration {
	t.Helper()
	ctx := context.Background()
	jobs := make([]*batchv1.Job, n+1)
	for i := range jobs {
		jobs[i] = newJob(dl.Namespace, fmt.Sprintf("%s-%d", phase, i), dl.Name)
		create(t, asTenant, jobs[i])
		cleanupJob(t, jobs[i])
	}
	running := runningJob(t, jobs)
	var took []time.Duration
	var lastToken int64
	for range n {
		start := time.Now()
		if err := asTenant.Delete(ctx, running); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete Job %s: %v", running.Name, err)
		}
		gone := running.Name
		jobs = slices.DeleteFunc(jobs, func(j *batchv1.Job) bool { return j.Name == gone })
		running = runningJob(t, jobs)
		took = append(took, time.Since(start))
		token, err := strconv.ParseInt(running.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
		if err != nil || token <= lastToken {
			t.Fatalf("Job %s started with fencing token %q after %d; want a larger number", running.Name, running.Annotations[locksv1alpha1.AnnotationFencingToken], lastToken)
		}
		lastToken = token
	}
	// The last one hands the lock to the next phase.
	if err := asTenant.Delete(ctx, running); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete Job %s: %v", running.Name, err)
	}
	slices.Sort(took)
	t.Logf("%s handovers: %v", phase, took)
	return took[len(took)/2]
}

// runningJob waits until exactly one of jobs has started with a fencing
// token, and returns it.
func runningJob(t *testing.T, jobs []*batchv1.Job) *batchv1.Job {
	t.Helper()
	var found *batchv1.Job
	eventually(t, 30*time.Second, "one Job of the lock to be running", func() (bool, string) {
		var started []string
		found = nil
		for _, j := range jobs {
			cur := getJob(t, j)
			if cur.Annotations[locksv1alpha1.AnnotationFencingToken] != "" && !ptr.Deref(cur.Spec.Suspend, true) {
				started = append(started, cur.Name)
				found = cur
			}
		}
		if len(started) > 1 {
			t.Fatalf("Jobs %v run at once", started)
		}
		return found != nil, fmt.Sprint(started)
	})
	return found
}

func backendMessage(t testing.TB, ns, name string) string {
	t.Helper()
	var b locksv1alpha1.LockBackend
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
		return err.Error()
	}
	if c := meta.FindStatusCondition(b.Status.Conditions, locksv1alpha1.ConditionReady); c != nil {
		return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	}
	return "no Ready condition"
}

func lockBackendMessage(t testing.TB, ns, name string) string {
	t.Helper()
	c, _ := condition(t, client.ObjectKey{Namespace: ns, Name: name}, locksv1alpha1.ConditionBackendReady)
	if c == nil {
		return "no BackendReady condition"
	}
	return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
}

// leaderLease returns the leader election Lease once it has a holder.
func leaderLease(t testing.TB) *coordinationv1.Lease {
	t.Helper()
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: tenancytest.OperatorNamespace, Name: "lockwarden.locks.lockwarden.io"}
	eventually(t, 30*time.Second, "the leader election Lease to have a holder", func() (bool, string) {
		err := env.Client.Get(context.Background(), key, &l)
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != "", fmt.Sprint(err)
	})
	return &l
}

// resetPeakRSS resets the kernel's high-water mark of this process's
// resident set (VmHWM), so that peakRSS reports the peak from now on.
func resetPeakRSS(t testing.TB) {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak resident set size on this system: %v", err)
	}
}

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func peakRSS(t testing.TB) uint64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range bytes.Lines(status) {
		if kb, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			v, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(string(kb)), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
