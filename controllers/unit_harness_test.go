package controllers

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testingclock "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/memory"
	"github.com/lockwarden/lockwarden/internal/watchdog"
	"github.com/lockwarden/lockwarden/internal/webhook"
)

// The unit harness runs the lock and Job reconcilers without a control
// plane or a store server: controller-runtime's fake client (with the
// field indexes the reconcilers look locks up by), the in-memory lock store,
// a fake clock that every part reads (reconcilers, store, lease clients and
// watchdog), and a fake Event recorder. Tests call Reconcile themselves, in
// the order the manager could, and move time with the clock: a TTL runs out
// because the clock was stepped past it, never because the test slept.

const (
	// unitNS is the namespace of every object of a unit test.
	unitNS = "batch"
	// unitCluster is the operator's --cluster-name.
	unitCluster = "east"
	// unitLockName names the lock the unit tests gate their Jobs on.
	unitLockName = "billing"
	// unitTTL is the lock's spec.ttlSeconds.
	unitTTL = 30 * time.Second
)

// unitStart is when every unit test starts, on its fake clock.
var unitStart = time.Date(2027, 3, 1, 2, 0, 0, 0, time.UTC)

// unitEnv is one unit test's operator: reconcilers, store and clock.
type unitEnv struct {
	t     *testing.T
	ctx   context.Context
	clock *testingclock.FakeClock
	// store is the lock backend's state; the reconcilers reach it through
	// the registry, other holders (another cluster) through their own Locker.
	store    *memory.Store
	client   client.Client
	scheme   *runtime.Scheme
	registry *backend.Registry
	dog      *watchdog.Watchdog
	tokens   *holder.Tokens
	events   *unitRecorder
	pods     *unitPods
	locks    *DistributedLockReconciler
	jobs     *JobReconciler
	// answered is closed when the backend first answers its health check.
	answered chan struct{}
	uids     int
	// waiterTTL, when set before the lock's backend is first used, is the
	// waiter TTL of the store's lockers (default lock.DefaultWaiterTTL):
	// a test of queue order that does not call every waiter again meanwhile.
	waiterTTL time.Duration
}

// newUnitEnv builds the operator as SetupWithManager wires it, on fakes.
func newUnitEnv(t *testing.T) *unitEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &unitEnv{t: t, ctx: ctx, clock: testingclock.NewFakeClock(unitStart), answered: make(chan struct{})}

	e.scheme = runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(e.scheme))
	utilruntime.Must(locksv1alpha1.AddToScheme(e.scheme))
	b := fake.NewClientBuilder().WithScheme(e.scheme).
		WithStatusSubresource(&locksv1alpha1.DistributedLock{}, &batchv1.Job{})
	// The indexes the manager's cache has, registered by the same code.
	if err := IndexFields(ctx, builderIndexer{b}); err != nil {
		t.Fatal(err)
	}
	e.client = b.Build()

	store, err := memory.NewStore(memory.WithStoreClock(e.clock))
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	newLocker := func(backend.Config) (backend.Locker, error) {
		opts := []memory.Option{memory.WithClock(e.clock)}
		if e.waiterTTL > 0 {
			opts = append(opts, memory.WithWaiterTTL(e.waiterTTL))
		}
		l, err := store.NewLocker(opts...)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	e.registry = backend.NewRegistry(ctx, e.client, newLocker, logr.Discard())
	var once sync.Once
	e.registry.OnHealth(func(_ string, err error) {
		if err == nil {
			once.Do(func() { close(e.answered) })
		}
	})

	if e.tokens, err = holder.NewTokens(bytes.Repeat([]byte{7}, holder.MinKeyLen)); err != nil {
		t.Fatal(err)
	}
	e.dog = watchdog.New(nil, watchdog.WithClock(e.clock))
	e.events = &unitRecorder{fake: events.NewFakeRecorder(1), scheme: e.scheme}
	e.pods = &unitPods{running: map[types.UID][]string{}}
	d := Deps{
		Client:      e.client,
		Registry:    e.registry,
		Watchdog:    e.dog,
		Tokens:      e.tokens,
		Recorder:    e.events,
		ClusterName: unitCluster,
		Clock:       e.clock,
		Log:         logr.Discard(),
	}
	e.locks = NewDistributedLockReconciler(d, LockOptions{})
	e.jobs = NewJobReconciler(d, e.locks.Enqueue)
	// What SetupWithManager and the Job controller's setup add.
	e.jobs.waits = newWaitMemory()
	e.jobs.pods = e.pods
	t.Cleanup(e.jobs.wakes.ShutDown)
	e.dog.OnLost(e.locks.onLost)
	e.dog.OnLost(e.jobs.onLost)
	return e
}

// builderIndexer registers field indexes with a fake client builder.
type builderIndexer struct{ b *fake.ClientBuilder }

func (i builderIndexer) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	i.b.WithIndex(obj, field, extract)
	return nil
}

// otherHolder is a holder the operator does not own: a Job of the same
// namespace and lock in another cluster that shares the store.
func otherHolder(name string) holder.Holder {
	uid := "west-" + name
	return holder.Holder{Cluster: "west", Namespace: unitNS, Lock: unitLockName, Kind: jobKind, Name: name, UID: uid,
		Identity: holder.WorkloadIdentity("west", unitNS, jobKind, name, uid)}
}

// jobHolder is the holder the operator acquires for gated Job j: what the
// store keeps beside its lease.
func jobHolder(j *batchv1.Job) holder.Holder {
	return holder.Holder{Cluster: unitCluster, Namespace: j.Namespace, Lock: j.Labels[locksv1alpha1.LabelLock], Kind: jobKind, Name: j.Name, UID: string(j.UID),
		Identity: holder.WorkloadIdentity(unitCluster, j.Namespace, jobKind, j.Name, string(j.UID))}
}

// otherLocker is another client of the store (another cluster's operator).
func (e *unitEnv) otherLocker() *memory.Locker {
	e.t.Helper()
	l, err := e.store.NewLocker(memory.WithClock(e.clock))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = l.Close() })
	return l
}

// takeKeys acquires the keys of lock name for h through l (no queue).
func (e *unitEnv) takeKeys(l lock.Locker, name string, h holder.Holder) *lock.Lease {
	e.t.Helper()
	lease, err := l.TryAcquire(e.ctx, lock.Request{Keys: backend.EngineKeys(e.lock(name)), TTL: unitTTL, Owner: "owner-of-" + h.Name, Holder: h.Encode()})
	if err != nil {
		e.t.Fatalf("%s acquiring the keys of lock %s: %v", h.Identity, name, err)
	}
	return lease
}

// storeState is what the store holds for the first key of lock name.
func (e *unitEnv) storeState(name string) lock.KeyState {
	e.t.Helper()
	states, err := e.otherLocker().Inspect(e.ctx, backend.EngineKeys(e.lock(name)))
	if err != nil || len(states) == 0 {
		e.t.Fatalf("inspect the keys of lock %s: %v", name, err)
	}
	return states[0]
}

// unitLock is a lock on key billing/ledger of an inline Redis, which the
// harness serves from the memory store: nothing is dialled.
func unitLock(name string) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: unitNS, UID: types.UID("uid-lock-" + name), Generation: 1},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:       []string{"billing/ledger"},
			TTLSeconds: int32(unitTTL / time.Second),
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.batch.svc:6379"}}},
		},
	}
}

// createLock creates dl and reconciles it until its status shows its
// backend answering, as the manager does once the backend is connected.
func (e *unitEnv) createLock(dl *locksv1alpha1.DistributedLock) {
	e.t.Helper()
	if err := e.client.Create(e.ctx, dl); err != nil {
		e.t.Fatal(err)
	}
	e.reconcileLock(dl.Name) // adds the finalizer
	e.reconcileLock(dl.Name) // connects
	select {
	case <-e.answered:
	case <-time.After(30 * time.Second):
		e.t.Fatal("the memory backend never answered the registry's health check")
	}
	e.reconcileLock(dl.Name)
	if c := findCondition(e.lock(dl.Name), locksv1alpha1.ConditionBackendReady); c == nil || c.Status != metav1.ConditionTrue {
		e.t.Fatalf("lock %s: BackendReady = %+v, want True", dl.Name, c)
	}
}

func (e *unitEnv) reconcileLock(name string) ctrl.Result {
	e.t.Helper()
	res, err := e.locks.Reconcile(e.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: unitNS, Name: name}})
	if err != nil {
		e.t.Fatalf("reconcile DistributedLock %s: %v", name, err)
	}
	return res
}

func (e *unitEnv) lock(name string) *locksv1alpha1.DistributedLock {
	e.t.Helper()
	var dl locksv1alpha1.DistributedLock
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: unitNS, Name: name}, &dl); err != nil {
		e.t.Fatalf("get DistributedLock %s: %v", name, err)
	}
	return &dl
}

// updateLock changes lock name's spec, as kubectl edit does.
func (e *unitEnv) updateLock(name string, change func(*locksv1alpha1.DistributedLock)) {
	e.t.Helper()
	dl := e.lock(name)
	change(dl)
	dl.Generation++
	if err := e.client.Update(e.ctx, dl); err != nil {
		e.t.Fatal(err)
	}
}

// submitJob creates a Job annotated with lock lockName as the admission
// webhook admits it (webhook.Gate: label, finalizer, suspended).
func (e *unitEnv) submitJob(name, lockName string) *batchv1.Job {
	e.t.Helper()
	return e.submitJobWith(name, lockName, nil)
}

// submitJobWith is submitJob for a Job with more annotations.
func (e *unitEnv) submitJobWith(name, lockName string, annotations map[string]string) *batchv1.Job {
	e.t.Helper()
	e.uids++
	ann := map[string]string{locksv1alpha1.AnnotationLock: lockName}
	maps.Copy(ann, annotations)
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: unitNS, UID: types.UID(fmt.Sprintf("%s-%03d", name, e.uids)),
			CreationTimestamp: metav1.NewTime(e.clock.Now()),
			Annotations:       ann},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	webhook.Gate(j, lockName, "")
	if err := e.client.Create(e.ctx, j); err != nil {
		e.t.Fatal(err)
	}
	return j
}

func (e *unitEnv) reconcileJob(name string) ctrl.Result {
	e.t.Helper()
	res, err := e.jobs.Reconcile(e.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: unitNS, Name: name}})
	if err != nil {
		e.t.Fatalf("reconcile Job %s: %v", name, err)
	}
	return res
}

func (e *unitEnv) job(name string) *batchv1.Job {
	e.t.Helper()
	var j batchv1.Job
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: unitNS, Name: name}, &j); err != nil {
		e.t.Fatalf("get Job %s: %v", name, err)
	}
	return &j
}

// finishJob marks Job name complete, as kube-controller-manager's Job
// controller does when its pod succeeded.
func (e *unitEnv) finishJob(name string) {
	e.t.Helper()
	j := e.job(name)
	now := metav1.NewTime(e.clock.Now())
	j.Status.StartTime, j.Status.CompletionTime, j.Status.Succeeded = &now, &now, 1
	j.Status.Conditions = append(j.Status.Conditions,
		batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
		batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now})
	if err := e.client.Status().Update(e.ctx, j); err != nil {
		e.t.Fatalf("mark Job %s complete: %v", name, err)
	}
}

// suspended tells whether the Job's pods may not run.
func suspended(j *batchv1.Job) bool { return j.Spec.Suspend == nil || *j.Spec.Suspend }

// jobFence is the fencing token a Job's pods get (its pod template's
// annotation, which the downward API hands them), checked against the Job's
// own annotation; 0 when it has none.
func (e *unitEnv) jobFence(j *batchv1.Job) int64 {
	e.t.Helper()
	onJob, onPods := j.Annotations[locksv1alpha1.AnnotationFencingToken], j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken]
	if onJob != onPods {
		e.t.Fatalf("Job %s shows fencing token %q, its pods get %q", j.Name, onJob, onPods)
	}
	if onPods == "" {
		return 0
	}
	f, err := strconv.ParseInt(onPods, 10, 64)
	if err != nil {
		e.t.Fatalf("Job %s fencing token %q: %v", j.Name, onPods, err)
	}
	return f
}

// findCondition returns the lock's condition of type t, or nil.
func findCondition(dl *locksv1alpha1.DistributedLock, t string) *metav1.Condition {
	for i := range dl.Status.Conditions {
		if dl.Status.Conditions[i].Type == t {
			return &dl.Status.Conditions[i]
		}
	}
	return nil
}

// requested drains the reconcile requests a tracker holds (from the
// watchdog's lost leases, a Job's start or release) and returns their
// names, oldest first.
func requested(tr *tracker) []string {
	var out []string
	for {
		select {
		case ev := <-tr.notify:
			out = append(out, ev.Object.GetName())
		default:
			return out
		}
	}
}

// unitRecorder records Events through client-go's FakeRecorder and keeps
// each with the kind and name of the object it regards, as kubectl
// describe shows them.
type unitRecorder struct {
	mu     sync.Mutex
	fake   *events.FakeRecorder
	scheme *runtime.Scheme
	seen   []unitEvent
}

// unitEvent is one recorded Event: on "Kind/name", and the FakeRecorder's
// line ("<type> <reason> <note>").
type unitEvent struct{ on, line string }

func (r *unitRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fake.Eventf(regarding, related, eventtype, reason, action, note, args...)
	line := <-r.fake.Events
	on := "?"
	if o, ok := regarding.(client.Object); ok {
		kind := "?"
		if gvk, err := apiutil.GVKForObject(o, r.scheme); err == nil {
			kind = gvk.Kind
		}
		on = kind + "/" + o.GetName()
	}
	r.seen = append(r.seen, unitEvent{on: on, line: line})
}

// on returns the lines of the Events on the object "Kind/name" with reason
// (every reason when empty), oldest first.
func (r *unitRecorder) on(obj, reason string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.seen {
		if ev.on != obj {
			continue
		}
		if f := strings.Fields(ev.line); reason == "" || (len(f) > 1 && f[1] == reason) {
			out = append(out, ev.line)
		}
	}
	return out
}

// unitPods answers the Job reconciler's listing of a released Job's pods
// that may still run: the ones a test says run (by Job UID).
type unitPods struct {
	mu      sync.Mutex
	running map[types.UID][]string
}

func (p *unitPods) set(uid types.UID, names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[uid] = names
}

func (p *unitPods) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return fmt.Errorf("the unit harness lists pods only")
}

func (p *unitPods) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	pods, ok := list.(*metav1.PartialObjectMetadataList)
	if !ok || lo.LabelSelector == nil {
		return fmt.Errorf("the unit harness lists pods' metadata by Job, got %T", list)
	}
	uid, ok := lo.LabelSelector.RequiresExactMatch(batchv1.ControllerUidLabel)
	if !ok {
		return fmt.Errorf("the unit harness lists pods by %s", batchv1.ControllerUidLabel)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pods.Items = nil
	for _, n := range p.running[types.UID(uid)] {
		pods.Items = append(pods.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: lo.Namespace}})
	}
	return nil
}
