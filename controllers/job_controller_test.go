package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// jobBuilder builds Jobs for tests.
type jobBuilder struct{ job batchv1.Job }

func makeJob(name, namespace string) *jobBuilder {
	return &jobBuilder{job: batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox", Command: []string{"true"}}},
		}}},
	}}
}

func (b *jobBuilder) annotate(k, v string) *jobBuilder {
	if b.job.Annotations == nil {
		b.job.Annotations = map[string]string{}
	}
	b.job.Annotations[k] = v
	return b
}
func (b *jobBuilder) lock(name string) *jobBuilder {
	return b.annotate(locksv1alpha1.AnnotationLock, name)
}
func (b *jobBuilder) ownedBy(cj *batchv1.CronJob) *jobBuilder {
	b.job.OwnerReferences = append(b.job.OwnerReferences, metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: ptr.To(true),
	})
	return b
}
func (b *jobBuilder) obj() *batchv1.Job { return b.job.DeepCopy() }

// makeCronJob creates a suspended CronJob annotated with lock, as `kubectl annotate` leaves it.
func makeCronJob(t *testing.T, c client.Client, name, namespace, lock, contention string) *batchv1.CronJob {
	t.Helper()
	ann := map[string]string{locksv1alpha1.AnnotationLock: lock}
	if contention != "" {
		ann[locksv1alpha1.AnnotationContention] = contention
	}
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: ann},
		Spec: batchv1.CronJobSpec{
			Schedule:    "* * * * *",
			Suspend:     ptr.To(true),
			JobTemplate: batchv1.JobTemplateSpec{Spec: makeJob("x", namespace).obj().Spec},
		},
	}
	if err := c.Create(context.Background(), cj); err != nil {
		t.Fatal(err)
	}
	return cj
}

func getJob(t *testing.T, c client.Client, namespace, name string) *batchv1.Job {
	t.Helper()
	var j batchv1.Job
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &j); err != nil {
		t.Fatalf("get Job %s: %v", name, err)
	}
	return &j
}

func running(j *batchv1.Job) bool {
	return j.Spec.Suspend != nil && !*j.Spec.Suspend && !jobFinished(j)
}

// waitQueued waits until the lock's status lists n waiters.
func waitQueued(t *testing.T, ns, lock string, n int) {
	t.Helper()
	// The place shows after the Job's reconcile and the lock's status
	// refresh; on a loaded 2-core machine that once took longer than 20 s
	// (a PostgreSQL store still starting up). The bound only says how long
	// a failure takes to show.
	eventually(t, 45*time.Second, fmt.Sprintf("%d waiter(s) in the queue of lock %s", n, lock), func() (bool, string) {
		dl := getLock(t, ns, lock)
		return len(dl.Status.Waiting) == n, fmt.Sprintf("%+v", dl.Status.Waiting)
	})
}

// waitRunning waits until the Job is unsuspended and returns it.
func waitRunning(t *testing.T, c client.Client, timeout time.Duration, namespace, name string) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	eventually(t, timeout, "Job "+name+" to run", func() (bool, string) {
		j = getJob(t, c, namespace, name)
		return running(j), fmt.Sprintf("suspend=%v annotations=%v", ptr.Deref(j.Spec.Suspend, false), j.Annotations)
	})
	return j
}

// complete marks a Job finished, as the Job controller would.
func complete(t *testing.T, c client.Client, j *batchv1.Job) {
	t.Helper()
	now := metav1.Now()
	name := j.Name
	// The operator may patch the Job meanwhile: retry a conflicting update.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		j := getJob(t, c, j.Namespace, name)
		j.Status.StartTime = &now
		j.Status.CompletionTime = &now
		j.Status.Succeeded = 1
		j.Status.Conditions = append(j.Status.Conditions,
			batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
			batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now})
		return c.Status().Update(context.Background(), j)
	})
	if err != nil {
		t.Fatalf("mark Job %s complete: %v", name, err)
	}
}

func fence(t *testing.T, j *batchv1.Job) int64 {
	t.Helper()
	f, err := strconv.ParseInt(j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	if err != nil {
		t.Fatalf("Job %s pod template fencing token %q: %v", j.Name, j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken], err)
	}
	return f
}

// overlapWatch watches a namespace's Jobs and records any moment at which two run at once.
type overlapWatch struct {
	mu       sync.Mutex
	overlaps []string
	stop     func()
}

func watchOverlap(t *testing.T, c client.WithWatch, namespace string) *overlapWatch {
	t.Helper()
	w, err := c.Watch(context.Background(), &batchv1.JobList{}, client.InNamespace(namespace))
	if err != nil {
		t.Fatal(err)
	}
	o := &overlapWatch{stop: w.Stop}
	go func() {
		runningNow := map[string]bool{}
		for ev := range w.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok {
				continue
			}
			runningNow[j.Name] = ev.Type != watch.Deleted && running(j)
			var names []string
			for n, r := range runningNow {
				if r {
					names = append(names, n)
				}
			}
			if len(names) > 1 {
				slices.Sort(names)
				o.mu.Lock()
				o.overlaps = append(o.overlaps, strings.Join(names, "+"))
				o.mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return o
}

func (o *overlapWatch) check(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.overlaps) > 0 {
		t.Fatalf("Jobs ran at the same time: %v", o.overlaps)
	}
}

func watchClient(t *testing.T, e *kubetest.Env) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestJobsOfTwoCronJobsRunOneAtATimeInFIFOOrder(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	report := makeCronJob(t, c, "nightly-report", ns, "billing", "")
	compact := makeCronJob(t, c, "ledger-compaction", ns, "billing", "")
	ov := watchOverlap(t, watchClient(t, env), ns)

	names := []string{"report-1", "compact-1", "report-2", "compact-2", "report-3", "compact-4"}
	for i, n := range names {
		owner := report
		if i%2 == 1 {
			owner = compact
		}
		create(t, makeJob(n, ns).ownedBy(owner).obj())
		if i == 0 {
			waitRunning(t, c, 10*time.Second, ns, n)
			continue
		}
		// FIFO is the order in which Jobs join the queue: let each join
		// before the next is created (Jobs created in the same instant
		// may join in either order).
		waitQueued(t, ns, "billing", i)
	}
	// Every waiter is queued before the first holder finishes.
	eventually(t, 10*time.Second, "five waiters in the lock's status", func() (bool, string) {
		dl := getLock(t, ns, "billing")
		return len(dl.Status.Waiting) == 5, fmt.Sprintf("%+v", dl.Status.Waiting)
	})
	dl := getLock(t, ns, "billing")
	if dl.Status.Holder == nil || dl.Status.Holder.Kind != "Job" || dl.Status.Holder.Name != "report-1" {
		t.Fatalf("lock status holder = %+v, want Job report-1", dl.Status.Holder)
	}

	var prev int64
	var handovers []time.Duration
	for i, n := range names {
		j := waitRunning(t, c, 10*time.Second, ns, n)
		for _, other := range names[i+1:] {
			if o := getJob(t, c, ns, other); running(o) {
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
			// Woken by the release notification, not by the fallback requeue
			// (handover figures: the benchmarks and the load harness).
			waitRunning(t, c, waitingRequeue-time.Second, ns, names[i+1])
			handovers = append(handovers, time.Since(start))
		}
	}
	ov.check(t)
	// kubectl describe dlock tells the story of the lock.
	eventually(t, 5*time.Second, "Acquired and Released events on the lock naming the Jobs", func() (bool, string) {
		evs := strings.Join(eventsFor(t, ns, "billing"), " | ")
		return strings.Contains(evs, "Acquired: Acquired by Job report-1") && strings.Contains(evs, "Released: Released by Job report-1"), evs
	})
	slices.Sort(handovers)
	t.Logf("handover from holder completion to the next Job unsuspended: min %v, median %v, max %v",
		handovers[0], handovers[len(handovers)/2], handovers[len(handovers)-1])
}

func TestJobGetsTheFencingTokenThroughTheDownwardAPI(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("migrate", ns).lock("billing").obj())
	j := waitRunning(t, env.Client, 10*time.Second, ns, "migrate")
	if !slices.Contains(j.Finalizers, locksv1alpha1.Finalizer) {
		t.Fatalf("finalizers %v lack %s", j.Finalizers, locksv1alpha1.Finalizer)
	}
	env0 := j.Spec.Template.Spec.Containers[0].Env
	want := map[string]string{
		locksv1alpha1.EnvFencingToken: "metadata.annotations['lockwarden.io/fencing-token']",
		locksv1alpha1.EnvHolder:       "metadata.annotations['lockwarden.io/holder']",
	}
	for _, e := range env0 {
		if path, ok := want[e.Name]; ok {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
				t.Fatalf("env %s = %+v, want fieldRef %s", e.Name, e, path)
			}
			delete(want, e.Name)
		}
	}
	if len(want) > 0 {
		t.Fatalf("container env %v lacks %v", env0, want)
	}
	if fence(t, j) <= 0 || j.Spec.Template.Annotations[locksv1alpha1.AnnotationHolder] == "" {
		t.Fatalf("pod template annotations %v lack the token and holder", j.Spec.Template.Annotations)
	}
}

func TestSkipNeverRunsWhileHeldAndSaysWhy(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("holder", ns).lock("billing").obj())
	h := waitRunning(t, c, 10*time.Second, ns, "holder")

	// A plain Job with contention Skip stays suspended, with the reason.
	create(t, makeJob("plain", ns).lock("billing").annotate(locksv1alpha1.AnnotationContention, "Skip").obj())
	eventually(t, 10*time.Second, "the plain Job to be marked skipped", func() (bool, string) {
		j := getJob(t, c, ns, "plain")
		return j.Annotations[locksv1alpha1.AnnotationSkipped] != "", fmt.Sprint(j.Annotations)
	})
	plain := getJob(t, c, ns, "plain")
	if running(plain) {
		t.Fatal("the skipped Job runs")
	}
	if want := fmt.Sprintf("fencing token %d", fence(t, h)); !strings.Contains(plain.Annotations[locksv1alpha1.AnnotationSkipped], want) || !strings.Contains(plain.Annotations[locksv1alpha1.AnnotationSkipped], "held by") {
		t.Fatalf("skip reason %q does not name the holder and %s", plain.Annotations[locksv1alpha1.AnnotationSkipped], want)
	}
	eventually(t, 5*time.Second, "a Skipped event on the Job", func() (bool, string) { return hasEvent(t, ns, "plain", locksv1alpha1.EventSkipped) })

	// A CronJob's Skip Job: the run is dropped and the CronJob's events say why.
	cj := makeCronJob(t, c, "nightly", ns, "billing", "Skip")
	create(t, makeJob("nightly-1", ns).ownedBy(cj).obj())
	eventually(t, 10*time.Second, "a Skipped event on the CronJob", func() (bool, string) { return hasEvent(t, ns, "nightly", locksv1alpha1.EventSkipped) })
	eventually(t, 10*time.Second, "the skipped CronJob Job to be gone", func() (bool, string) {
		var j batchv1.Job
		err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "nightly-1"}, &j)
		return apierrors.IsNotFound(err) || !j.DeletionTimestamp.IsZero(), fmt.Sprint(err)
	})
	if running(getJob(t, c, ns, "holder")) == false {
		t.Fatal("the holder stopped running")
	}
}

func TestDeletingTheHoldingJobReleasesAtOnce(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).ttl(600).obj())
	create(t, makeJob("first", ns).lock("billing").obj())
	first := waitRunning(t, c, 10*time.Second, ns, "first")
	create(t, makeJob("second", ns).lock("billing").obj())
	waitCondition(t, 10*time.Second, ns, "billing", locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired)

	if err := c.Delete(context.Background(), first, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	// TTL 600 s: the second running within seconds means the first was released.
	second := waitRunning(t, c, 5*time.Second, ns, "second")
	if fence(t, second) <= fence(t, first) {
		t.Fatalf("second token %d not larger than first %d", fence(t, second), fence(t, first))
	}
	eventually(t, 5*time.Second, "the deleted Job to be gone (finalizer removed)", func() (bool, string) {
		var j batchv1.Job
		err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "first"}, &j)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func TestManagerRestartInTheMiddleOfAJobHold(t *testing.T) {
	rdb := redistest.Start(t)
	m1 := startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).ttl(restartTTL).obj())
	create(t, makeJob("long", ns).lock("billing").obj())
	held := waitRunning(t, c, 10*time.Second, ns, "long")
	create(t, makeJob("next", ns).lock("billing").obj())
	ov := watchOverlap(t, watchClient(t, env), ns)

	m1.stop()
	// Down until a renewal was missed, then a new manager takes over.
	ttl := restartTTL * time.Second
	waitRenewalMissed(t, rdb.Client(), lockKey(ns, "billing/ledger"), ttl)
	startManager(t, managerOptions{})
	waitRenewedAfterRestart(t, rdb.Client(), lockKey(ns, "billing/ledger"), ttl)
	// Past what the inherited lease had left, and past a fallback requeue of
	// the waiting Job, the first still holds with the same token, and the
	// next waits.
	deadline := time.Now().Add(ttl / 2)
	for time.Now().Before(deadline) {
		if j := getJob(t, c, ns, "next"); running(j) {
			t.Fatal("the waiting Job started while the holder still ran")
		}
		time.Sleep(250 * time.Millisecond)
	}
	long := getJob(t, c, ns, "long")
	if got := fence(t, long); got != fence(t, held) {
		t.Fatalf("token changed across the restart: %d -> %d", fence(t, held), got)
	}
	if lost := long.Annotations[locksv1alpha1.AnnotationLost]; lost != "" {
		t.Fatalf("the holder was marked lost across the restart: %s", lost)
	}
	complete(t, c, held)
	waitRunning(t, c, 5*time.Second, ns, "next")
	ov.check(t)
}

func TestTwoClustersSharingOneRedisNeverOverlap(t *testing.T) {
	rdb := redistest.Start(t)
	envB := kubetest.Start(t, kubetest.WithWebhooks())
	startManager(t, managerOptions{cluster: "east"})
	startManager(t, managerOptions{cluster: "west", env: envB})
	// The same namespace name in both clusters: scope Namespace keys are equal.
	const ns = "batch"
	namedNamespace(t, env, ns)
	namedNamespace(t, envB, ns)
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	if err := envB.Client.Create(context.Background(), makeLock("billing", ns, rdb.Addr).obj()); err != nil {
		t.Fatal(err)
	}
	ovA, ovB := watchOverlap(t, watchClient(t, env), ns), watchOverlap(t, watchClient(t, envB), ns)

	create(t, makeJob("east-1", ns).lock("billing").obj())
	east := waitRunning(t, env.Client, 10*time.Second, ns, "east-1")
	if err := envB.Client.Create(context.Background(), makeJob("west-1", ns).lock("billing").obj()); err != nil {
		t.Fatal(err)
	}
	// The west lock's status shows the holder in the other cluster.
	eventually(t, 10*time.Second, "the west lock to name the east holder", func() (bool, string) {
		var dl locksv1alpha1.DistributedLock
		if err := envB.Client.Get(context.Background(), nn(ns, "billing"), &dl); err != nil {
			return false, err.Error()
		}
		return dl.Status.Holder != nil && dl.Status.Holder.Cluster == "east" && dl.Status.Holder.Name == "east-1", fmt.Sprintf("%+v", dl.Status.Holder)
	})
	if j := getJob(t, envB.Client, ns, "west-1"); running(j) {
		t.Fatal("west-1 runs while east-1 holds the lock")
	}
	start := time.Now()
	complete(t, env.Client, east)
	// Woken through Redis from the other cluster, not by the fallback requeue.
	west := waitRunning(t, envB.Client, waitingRequeue-time.Second, ns, "west-1")
	t.Logf("cross-cluster handover: %v", time.Since(start))
	if fence(t, west) <= fence(t, east) {
		t.Fatalf("west token %d not larger than east %d", fence(t, west), fence(t, east))
	}
	ovA.check(t)
	ovB.check(t)
}

func TestUnrelatedJobsAreUntouchedAlsoWhileRedisIsDown(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	rdb.Kill()
	other := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "unrelated", Namespace: ns},
		Spec: batchv1.CronJobSpec{Schedule: "* * * * *", Suspend: ptr.To(true), JobTemplate: batchv1.JobTemplateSpec{Spec: makeJob("x", ns).obj().Spec}}}
	create(t, other)
	for name, j := range map[string]*batchv1.Job{
		"plain":        makeJob("plain", ns).obj(),
		"of a cronjob": makeJob("cron-child", ns).ownedBy(other).obj(),
	} {
		t.Run(name, func(t *testing.T) {
			create(t, j)
			got := getJob(t, env.Client, ns, j.Name)
			if got.Spec.Suspend != nil && *got.Spec.Suspend || len(got.Finalizers) > 0 || got.Labels[locksv1alpha1.LabelLock] != "" ||
				len(got.Spec.Template.Spec.Containers[0].Env) > 0 {
				t.Fatalf("an unrelated Job was changed: suspend=%v finalizers=%v labels=%v env=%v",
					got.Spec.Suspend, got.Finalizers, got.Labels, got.Spec.Template.Spec.Containers[0].Env)
			}
		})
	}
}

func TestMalformedAnnotationsAreDenied(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	cj := makeCronJob(t, env.Client, "bad-cron", ns, "Not_A_Name", "")
	cases := map[string]struct {
		job  *batchv1.Job
		want []string
	}{
		"lock that is not a name": {makeJob("a", ns).lock("Billing!").obj(),
			[]string{"metadata.annotations[lockwarden.io/lock]", `"Billing!"`, "must name a DistributedLock"}},
		"lock that does not exist": {makeJob("b", ns).lock("payroll").obj(),
			[]string{"metadata.annotations[lockwarden.io/lock]", `no DistributedLock "payroll"`, ns}},
		"unknown contention": {makeJob("c", ns).lock("billing").annotate(locksv1alpha1.AnnotationContention, "Wait").obj(),
			[]string{"metadata.annotations[lockwarden.io/contention]", `"Wait"`, `"Queue"`, `"Skip"`}},
		"empty lock": {makeJob("d", ns).lock("").obj(),
			[]string{"metadata.annotations[lockwarden.io/lock]", "must name a DistributedLock"}},
		"bad annotation on the owning CronJob": {makeJob("e", ns).ownedBy(cj).obj(),
			[]string{"metadata.annotations[lockwarden.io/lock]", "on CronJob bad-cron", `"Not_A_Name"`}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := env.Client.Create(context.Background(), tc.job)
			if err == nil {
				t.Fatal("the Job was admitted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("denial %q does not contain %q", err, w)
				}
			}
		})
	}
}

// staleClient answers Get for one Job with an old copy, as a lagging cache would.
type staleClient struct {
	client.Client
	job *batchv1.Job
}

func (c staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if j, ok := obj.(*batchv1.Job); ok && key == client.ObjectKeyFromObject(c.job) {
		c.job.DeepCopyInto(j)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func TestStaleJobNeverGetsASecondFencingToken(t *testing.T) {
	rdb := redistest.Start(t)
	m := startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	j := makeJob("once", ns).lock("billing").obj()
	create(t, j)
	stale := j.DeepCopy() // as created: suspended, no token, the creation's resourceVersion
	running := waitRunning(t, c, 10*time.Second, ns, "once")
	first := fence(t, running)

	// A reconcile that sees the Job as it was before it started.
	r := *m.jobs
	r.Client = staleClient{Client: m.jobs.Client, job: stale}
	_, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(j)})
	if err == nil || !apierrors.IsConflict(errors.Unwrap(err)) {
		t.Fatalf("reconcile of a stale Job = %v, want a conflict (the start patch must not apply to a newer Job)", err)
	}
	if got := fence(t, getJob(t, c, ns, "once")); got != first {
		t.Fatalf("the Job's token changed from %d to %d", first, got)
	}
	// Redis still holds the first token: no second acquisition happened.
	v, err := rdb.Client().Get(context.Background(), lockKey(ns, "billing/ledger")).Result()
	if f, ok := redistest.LeaseFence(v); err != nil || !ok || f != first {
		t.Fatalf("Redis holds the lease %q (%v), want fencing token %d", v, err, first)
	}
}
