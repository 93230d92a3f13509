package controllers

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/watchdog"
	"github.com/lockwarden/lockwarden/internal/webhook"
)

var env *kubetest.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Unit tests only: the suites that need a control plane skip.
		os.Exit(m.Run())
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())))
	backend.RouteRedisLogs(ctrl.Log.WithName("go-redis"))
	e, err := kubetest.StartEnv(kubetest.WithWebhooks())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}

// testOwnerKey is the owner key of every manager the tests start: a
// restarted manager derives the same owner tokens, as replicas do from the
// shared Secret.
var testOwnerKey = bytes.Repeat([]byte{42}, holder.MinKeyLen)

// managerOptions adjust the manager a test starts.
type managerOptions struct {
	cluster string
	// policy is the registry's (default: inline endpoints anywhere, Global nowhere).
	policy backend.Policy
	resync time.Duration
	// syncCronJobs runs the CronJob annotation sync (off by default, as in production).
	syncCronJobs bool
	// env is the control plane to run against (default: the package's).
	env *kubetest.Env
	// configCheck is how often the registry reads the servers' settings
	// again (default: backend.DefaultConfigCheckInterval).
	configCheck time.Duration
	// events, when set, sees every Event the controllers record (after
	// their own filtering), before the manager's recorder does.
	events *eventLog
	// wrapLocker, when set, wraps every backend client the registry builds
	// (to count the calls the controllers make).
	wrapLocker func(backend.Config, backend.Locker) backend.Locker
	// waitRequeue is how soon a waiting Job tries again (default waitingRequeue).
	waitRequeue time.Duration
	// shows, when set, replaces the per-namespace bound on queue-position
	// writes (a nil *keyedLimiter in it lifts the bound).
	shows **keyedLimiter
	// namespaceQPS is each namespace's share of reconciles a second
	// (default DefaultNamespaceQPS; negative: no bound), with a burst of
	// namespaceBurst when that is set.
	namespaceQPS   float64
	namespaceBurst int
}

// eventLog is an events.EventRecorder that remembers the namespace and
// reason of every Event and passes it on.
type eventLog struct {
	events.EventRecorder
	mu   sync.Mutex
	seen []string // "<namespace>/<reason>"
}

func (e *eventLog) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if o, ok := regarding.(metav1.Object); ok {
		e.mu.Lock()
		e.seen = append(e.seen, o.GetNamespace()+"/"+reason)
		e.mu.Unlock()
	}
	e.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// count returns how many Events with reason were recorded in namespace ns.
func (e *eventLog) count(ns, reason string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.seen {
		if s == ns+"/"+reason {
			n++
		}
	}
	return n
}

// testManager is a running manager with the lock controller.
type testManager struct {
	reconciler *DistributedLockReconciler
	jobs       *JobReconciler
	stop       func()
}

// startManager starts a manager with the DistributedLock controller, as main
// does, and stops it when the test ends (or earlier, with stop).
func startManager(t testing.TB, o managerOptions) *testManager {
	t.Helper()
	needEnv(t)
	if o.cluster == "" {
		o.cluster = "test"
	}
	if o.resync == 0 {
		o.resync = DefaultResyncPeriod
	}
	if o.env == nil {
		o.env = env
	}
	skipNameValidation := true
	host, port, certDir := o.env.Webhook()
	mgr, err := ctrl.NewManager(o.env.Config, ctrl.Options{
		Scheme:  o.env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Jobs cached as the manager caches them: without their pod
		// templates' specs.
		Cache:                  cache.Options{ByObject: map[client.Object]cache.ByObject{&batchv1.Job{}: {Transform: LeanJob}}},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skipNameValidation},
		WebhookServer:          ctrlwebhook.NewServer(ctrlwebhook.Options{Host: host, Port: port, CertDir: certDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tokens, err := holder.NewTokens(testOwnerKey)
	if err != nil {
		t.Fatal(err)
	}
	newLocker := backend.NewLocker(ctrl.Log.WithName("lock"))
	if o.wrapLocker != nil {
		build := newLocker
		newLocker = func(cfg backend.Config) (backend.Locker, error) {
			l, err := build(cfg)
			if err != nil {
				return nil, err
			}
			return o.wrapLocker(cfg, l), nil
		}
	}
	registry := backend.NewRegistry(ctx, mgr.GetAPIReader(), newLocker, ctrl.Log.WithName("backend"))
	registry.SetHealthInterval(500 * time.Millisecond)
	if o.configCheck > 0 {
		registry.SetConfigCheckInterval(o.configCheck)
	}
	registry.SetPolicy(o.policy, mgr.GetClient())
	dog := watchdog.New(nil)
	if err := mgr.Add(dog); err != nil {
		t.Fatal(err)
	}
	var recorder events.EventRecorder = mgr.GetEventRecorder("lockwarden")
	if o.events != nil {
		o.events.EventRecorder = recorder
		recorder = o.events
	}
	rs, err := SetupWithManager(ctx, mgr, Deps{
		Client:      mgr.GetClient(),
		Registry:    registry,
		Watchdog:    dog,
		Tokens:      tokens,
		Recorder:    recorder,
		ClusterName: o.cluster,
	}, LockOptions{MinSafeTTL: 20 * time.Second, Resync: o.resync, SyncCronJobTemplates: o.syncCronJobs, NamespaceQPS: o.namespaceQPS})
	if err != nil {
		t.Fatal(err)
	}
	rs.Jobs.waitRequeue = o.waitRequeue
	if o.namespaceBurst > 0 {
		rs.Jobs.budget, rs.Locks.budget = newBudget(o.namespaceQPS, o.namespaceBurst), newBudget(o.namespaceQPS, o.namespaceBurst)
	}
	if o.shows != nil {
		rs.Jobs.shows = *o.shows
	}
	if err := (&webhook.JobGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Check: registry.Check}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := (&webhook.PodGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Check: registry.Check}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	(&webhook.WorkloadGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(mgr)
	(&webhook.ForceReleaseAudit{Seal: tokens.ForceReleaseSeal}).SetupWithManager(mgr)
	(&webhook.LockSpecCheck{}).SetupWithManager(mgr)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var stopped atomic.Bool
	stop := func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	// Ready when the webhook answers: Jobs created from now on are gated.
	eventually(t, 10*time.Second, "the webhook server to listen", func() (bool, string) {
		err := mgr.GetWebhookServer().StartedChecker()(nil)
		return err == nil, fmt.Sprint(err)
	})
	return &testManager{reconciler: rs.Locks, jobs: rs.Jobs, stop: stop}
}

// zapLevel logs everything with LOCKWARDEN_TEST_LOG set, else errors only.
func zapLevel() zapcore.Level {
	if os.Getenv("LOCKWARDEN_TEST_LOG") != "" {
		return zapcore.Level(-2)
	}
	return zapcore.ErrorLevel
}

// newNamespace creates a namespace with a unique name for one test.
func newNamespace(t testing.TB, labels map[string]string) string {
	t.Helper()
	needEnv(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-", Labels: labels}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// namedNamespace creates a namespace with the given name in e.
func namedNamespace(t *testing.T, e *kubetest.Env, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// lockBuilder builds DistributedLocks for tests.
type lockBuilder struct{ dl locksv1alpha1.DistributedLock }

func makeLock(name, namespace string, endpoints ...string) *lockBuilder {
	return &lockBuilder{dl: locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:       []string{"billing/ledger"},
			TTLSeconds: 30,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: endpoints}},
		},
	}}
}

func (b *lockBuilder) keys(k ...string) *lockBuilder { b.dl.Spec.Keys = k; return b }
func (b *lockBuilder) ttl(s int32) *lockBuilder      { b.dl.Spec.TTLSeconds = s; return b }
func (b *lockBuilder) holder(id string) *lockBuilder {
	b.dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: id}
	return b
}
func (b *lockBuilder) scope(s locksv1alpha1.Scope) *lockBuilder { b.dl.Spec.Scope = s; return b }
func (b *lockBuilder) password(secret, key string) *lockBuilder {
	b.dl.Spec.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: secret, Key: key}
	return b
}
func (b *lockBuilder) obj() *locksv1alpha1.DistributedLock { return b.dl.DeepCopy() }

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func getLock(t *testing.T, namespace, name string) *locksv1alpha1.DistributedLock {
	t.Helper()
	var dl locksv1alpha1.DistributedLock
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &dl); err != nil {
		t.Fatalf("get DistributedLock %s/%s: %v", namespace, name, err)
	}
	return &dl
}

// eventually polls cond every 25ms until it returns true, failing after timeout with the last message.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 25*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, last)
	}
}

// waitCondition waits until the lock's condition has the status and reason, returning the lock.
func waitCondition(t *testing.T, timeout time.Duration, namespace, name, condType string, status metav1.ConditionStatus, reason string) *locksv1alpha1.DistributedLock {
	t.Helper()
	var dl locksv1alpha1.DistributedLock
	eventually(t, timeout, fmt.Sprintf("%s/%s %s=%s (%s)", namespace, name, condType, status, reason), func() (bool, string) {
		if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &dl); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(dl.Status.Conditions, condType)
		if c == nil {
			return false, "no condition"
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	return &dl
}

// eventsFor lists the Events regarding a lock, as `kubectl describe` shows them.
func eventsFor(t *testing.T, namespace, name string) []string {
	t.Helper()
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}

func hasEvent(t *testing.T, namespace, name, reason string) (bool, string) {
	evs := eventsFor(t, namespace, name)
	for _, e := range evs {
		if strings.HasPrefix(e, reason+":") {
			return true, e
		}
	}
	return false, strings.Join(evs, " | ")
}

func nn(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
