package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The bounds of waiting: where a waiting Job is in the queue (its
// annotations and Waiting Events), how long it may wait (max wait), which
// of a CronJob's Jobs keep waiting (QueueLatest), and how a Job that does
// not run ends (Skip). The envtest control plane runs no Job controller:
// a Job that ends without running shows lockwarden's FailureTarget
// condition; test/bounds checks that kube-controller-manager turns it into
// Failed.

// waitTimeout bounds how long a test waits for something the operator does
// at once or at a waiting Job's next requeue.
const waitTimeout = 3 * waitingRequeue

// waitPosition waits until the Job shows the queue position, and returns it.
func waitPosition(t *testing.T, namespace, name, position string) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	eventually(t, waitTimeout, fmt.Sprintf("Job %s at queue position %s", name, position), func() (bool, string) {
		j = getJob(t, env.Client, namespace, name)
		return j.Annotations[locksv1alpha1.AnnotationQueuePosition] == position && !running(j),
			fmt.Sprintf("position %q, waiting for %q, running %v", j.Annotations[locksv1alpha1.AnnotationQueuePosition], j.Annotations[locksv1alpha1.AnnotationWaitingFor], running(j))
	})
	return j
}

// waitingEvents returns the notes of the Waiting Events on a Job, sorted.
func waitingEvents(t *testing.T, namespace, name string) []string {
	t.Helper()
	var out []string
	for _, e := range eventsFor(t, namespace, name) {
		if note, ok := strings.CutPrefix(e, locksv1alpha1.EventWaiting+": "); ok {
			out = append(out, note)
		}
	}
	slices.Sort(out)
	return out
}

// failureTarget returns the Job's FailureTarget condition, if any.
func failureTarget(j *batchv1.Job) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if c := &j.Status.Conditions[i]; c.Type == batchv1.JobFailureTarget {
			return c
		}
	}
	return nil
}

// waitEnded waits until lockwarden ended the Job with reason (its
// FailureTarget condition), and returns it once its finalizer is gone.
func waitEnded(t *testing.T, namespace, name, reason string) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	eventually(t, waitTimeout, fmt.Sprintf("Job %s to end with reason %s, its finalizer removed", name, reason), func() (bool, string) {
		j = getJob(t, env.Client, namespace, name)
		c := failureTarget(j)
		if c == nil {
			return false, fmt.Sprintf("no FailureTarget; conditions %+v, annotations %v", j.Status.Conditions, j.Annotations)
		}
		return c.Status == corev1.ConditionTrue && c.Reason == reason && !slices.Contains(j.Finalizers, locksv1alpha1.Finalizer),
			fmt.Sprintf("FailureTarget %s %s: %s; finalizers %v", c.Status, c.Reason, c.Message, j.Finalizers)
	})
	return j
}

// checkNeverRan fails unless the Job is still suspended, without a fencing
// token, and without the waiting annotations (removed when it ended).
func checkNeverRan(t *testing.T, j *batchv1.Job) {
	t.Helper()
	if !ptr.Deref(j.Spec.Suspend, false) || j.Annotations[locksv1alpha1.AnnotationFencingToken] != "" {
		t.Errorf("Job %s ran: suspend=%v annotations=%v", j.Name, ptr.Deref(j.Spec.Suspend, false), j.Annotations)
	}
	for _, k := range []string{locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor} {
		if v, ok := j.Annotations[k]; ok {
			t.Errorf("ended Job %s still has %s=%q", j.Name, k, v)
		}
	}
}

// inQueue returns the number of waiters Redis holds in the queue of the key.
func inQueue(t *testing.T, rdb *redistest.Server, namespace, key string) int64 {
	t.Helper()
	n, err := rdb.Client().ZCard(context.Background(), "lockwarden:{ns/"+namespace+"/"+key+"}:queue").Result()
	if err != nil {
		t.Fatalf("queue length: %v", err)
	}
	return n
}

func TestWaitingJobsShowTheirPlaceInTheQueue(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("holder", ns).lock("billing").obj())
	h := waitRunning(t, c, 10*time.Second, ns, "holder")
	heldBy := fmt.Sprintf("held by %s (fencing token %d)", h.Annotations[locksv1alpha1.AnnotationHolder], fence(t, h))

	// Three Jobs join the queue behind the holder, one after the other.
	create(t, makeJob("w1", ns).lock("billing").obj())
	waitPosition(t, ns, "w1", "1/1")
	create(t, makeJob("w2", ns).lock("billing").obj())
	waitPosition(t, ns, "w2", "2/2")
	create(t, makeJob("w3", ns).lock("billing").obj())
	for i, n := range []string{"w1", "w2", "w3"} {
		j := waitPosition(t, ns, n, fmt.Sprintf("%d/3", i+1))
		want := heldBy
		if i > 0 {
			want += fmt.Sprintf(", %d waiter(s) ahead", i)
		}
		if got := j.Annotations[locksv1alpha1.AnnotationWaitingFor]; got != want {
			t.Errorf("Job %s waiting-for = %q, want %q", n, got, want)
		}
	}

	// The holder finishes: w1 runs, the others move up.
	complete(t, c, h)
	w1 := waitRunning(t, c, 10*time.Second, ns, "w1")
	for _, k := range []string{locksv1alpha1.AnnotationQueuePosition, locksv1alpha1.AnnotationWaitingFor} {
		if v, ok := w1.Annotations[k]; ok {
			t.Errorf("the running Job w1 still has %s=%q", k, v)
		}
	}
	w1HeldBy := fmt.Sprintf("held by %s (fencing token %d)", w1.Annotations[locksv1alpha1.AnnotationHolder], fence(t, w1))
	waitPosition(t, ns, "w2", "1/2")
	if got := waitPosition(t, ns, "w3", "2/2").Annotations[locksv1alpha1.AnnotationWaitingFor]; got != w1HeldBy+", 1 waiter(s) ahead" {
		t.Errorf("w3 waiting-for = %q, want it to name the new holder w1", got)
	}

	complete(t, c, w1)
	w2 := waitRunning(t, c, 10*time.Second, ns, "w2")
	waitPosition(t, ns, "w3", "1/1")

	// One Waiting Event per position w3 held (not one per requeue), each
	// naming the holder it waited behind.
	w3Events := []string{
		"Waiting for lock billing: position 1 of 1, behind " + describeHolder(w2.Annotations[locksv1alpha1.AnnotationHolder], fence(t, w2)),
		"Waiting for lock billing: position 2 of 2, behind " + describeHolder(w1.Annotations[locksv1alpha1.AnnotationHolder], fence(t, w1)),
		"Waiting for lock billing: position 3 of 3, behind " + describeHolder(h.Annotations[locksv1alpha1.AnnotationHolder], fence(t, h)),
	}
	eventually(t, 5*time.Second, "w3's Waiting Events", func() (bool, string) {
		got := waitingEvents(t, ns, "w3")
		return cmp.Equal(w3Events, got), cmp.Diff(w3Events, got)
	})

	complete(t, c, w2)
	w3 := waitRunning(t, c, 10*time.Second, ns, "w3")
	if _, ok := w3.Annotations[locksv1alpha1.AnnotationQueuePosition]; ok {
		t.Errorf("the running Job w3 still shows a queue position: %v", w3.Annotations)
	}
}

func TestMaxWaitEndsAWaitingJob(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	dl := makeLock("billing", ns, rdb.Addr).obj()
	dl.Spec.MaxWaitSeconds = 4
	create(t, dl)
	create(t, makeJob("holder", ns).lock("billing").obj())
	waitRunning(t, c, 10*time.Second, ns, "holder")

	// impatient waits the lock's 4 s; patient's annotation gives it an hour;
	// the CronJob's annotation gives its Job 2 s.
	create(t, makeJob("impatient", ns).lock("billing").obj())
	waitPosition(t, ns, "impatient", "1/1")
	create(t, makeJob("patient", ns).lock("billing").annotate(locksv1alpha1.AnnotationMaxWait, "1h").obj())
	waitPosition(t, ns, "patient", "2/2")
	nightly := makeCronJob(t, c, "nightly", ns, "billing", "")
	nightly.Annotations[locksv1alpha1.AnnotationMaxWait] = "2s"
	if err := c.Update(context.Background(), nightly); err != nil {
		t.Fatal(err)
	}
	create(t, makeJob("nightly-1", ns).ownedBy(nightly).obj())
	if got := getJob(t, c, ns, "nightly-1").Annotations[locksv1alpha1.AnnotationMaxWait]; got != "2s" {
		t.Fatalf("the CronJob's Job has max-wait %q, want the CronJob's 2s", got)
	}

	n1 := waitEnded(t, ns, "nightly-1", locksv1alpha1.JobReasonWaitTimedOut)
	checkNeverRan(t, n1)
	eventually(t, 5*time.Second, "a WaitTimedOut Event on the CronJob", func() (bool, string) {
		return hasEvent(t, ns, "nightly", locksv1alpha1.EventWaitTimedOut)
	})

	imp := waitEnded(t, ns, "impatient", locksv1alpha1.JobReasonWaitTimedOut)
	checkNeverRan(t, imp)
	if msg := failureTarget(imp).Message; !containsAll(msg, "billing", "maximum wait of 4s") {
		t.Errorf("FailureTarget message %q does not name the lock and the maximum wait", msg)
	}
	if waited := failureTarget(imp).LastTransitionTime.Sub(imp.CreationTimestamp.Time); waited < 4*time.Second {
		t.Errorf("impatient ended %v after its creation, before its maximum wait of 4s", waited)
	}
	eventually(t, 5*time.Second, "a WaitTimedOut Event on the Job", func() (bool, string) {
		return hasEvent(t, ns, "impatient", locksv1alpha1.EventWaitTimedOut)
	})
	// It left the queue: patient moved up, and Redis holds one waiter.
	waitPosition(t, ns, "patient", "1/1")
	if n := inQueue(t, rdb, ns, "billing/ledger"); n != 1 {
		t.Errorf("Redis holds %d waiters, want 1 (patient)", n)
	}
	// The lock's 4 s passed for patient too (it was created after
	// impatient, within a requeue): its annotation keeps it waiting.
	deadline := getJob(t, c, ns, "patient").CreationTimestamp.Add(4*time.Second + waitingRequeue)
	eventually(t, time.Until(deadline)+time.Second, "the lock's max wait to pass for patient", func() (bool, string) {
		return time.Now().After(deadline), ""
	})
	if p := getJob(t, c, ns, "patient"); failureTarget(p) != nil || p.Annotations[locksv1alpha1.AnnotationQueuePosition] != "1/1" {
		t.Fatalf("patient (max-wait 1h) stopped waiting: conditions %+v, annotations %v", p.Status.Conditions, p.Annotations)
	}
}

func TestQueueLatestKeepsOnlyTheNewestJobOfACronJob(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	ov := watchOverlap(t, watchClient(t, env), ns)
	report := makeCronJob(t, c, "report", ns, "billing", string(locksv1alpha1.ContentionQueueLatest))
	create(t, makeJob("report-0", ns).ownedBy(report).obj())
	waitRunning(t, c, 10*time.Second, ns, "report-0")

	// The CronJob fires five more times while report-0 runs; a plain Job
	// with QueueLatest joins in between (it has no CronJob: Queue).
	for i := 1; i <= 5; i++ {
		create(t, makeJob(fmt.Sprintf("report-%d", i), ns).ownedBy(report).obj())
		if i == 2 {
			create(t, makeJob("adhoc", ns).lock("billing").annotate(locksv1alpha1.AnnotationContention, string(locksv1alpha1.ContentionQueueLatest)).obj())
		}
	}
	for i := 1; i <= 4; i++ {
		n := fmt.Sprintf("report-%d", i)
		j := waitEnded(t, ns, n, locksv1alpha1.JobReasonSuperseded)
		checkNeverRan(t, j)
		// It names the newest Job it saw, created after it.
		msg := failureTarget(j).Message
		var by int
		if _, err := fmt.Sscanf(msg, "Superseded by the newer Job report-%d ", &by); err != nil || by <= i || !strings.Contains(msg, "QueueLatest") {
			t.Errorf("%s: FailureTarget message %q does not name a newer Job of the CronJob and the contention", n, msg)
		}
		eventually(t, 5*time.Second, "a Superseded Event on "+n, func() (bool, string) {
			return hasEvent(t, ns, n, locksv1alpha1.EventSuperseded)
		})
	}
	eventually(t, 5*time.Second, "Superseded Events on the CronJob", func() (bool, string) {
		return hasEvent(t, ns, "report", locksv1alpha1.EventSuperseded)
	})
	// The newest waits behind the plain Job, which joined before it.
	waitPosition(t, ns, "adhoc", "1/2")
	waitPosition(t, ns, "report-5", "2/2")
	if j := getJob(t, c, ns, "report-0"); !running(j) || failureTarget(j) != nil {
		t.Fatalf("the running report-0 was affected: suspend=%v conditions=%+v", ptr.Deref(j.Spec.Suspend, false), j.Status.Conditions)
	}
	ov.check(t)
}

func TestSkipEndsAPlainJobAsSkipped(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("holder", ns).lock("billing").obj())
	h := waitRunning(t, c, 10*time.Second, ns, "holder")

	create(t, makeJob("report", ns).lock("billing").annotate(locksv1alpha1.AnnotationContention, string(locksv1alpha1.ContentionSkip)).obj())
	j := waitEnded(t, ns, "report", locksv1alpha1.JobReasonSkipped)
	checkNeverRan(t, j)
	heldBy := fmt.Sprintf("held by %s (fencing token %d)", h.Annotations[locksv1alpha1.AnnotationHolder], fence(t, h))
	if msg := failureTarget(j).Message; !containsAll(msg, "Not run", heldBy, "contention Skip") {
		t.Errorf("FailureTarget message %q does not say the Job did not run, behind %q", msg, heldBy)
	}
	if !strings.Contains(j.Annotations[locksv1alpha1.AnnotationSkipped], heldBy) {
		t.Errorf("skipped annotation %q does not name the holder", j.Annotations[locksv1alpha1.AnnotationSkipped])
	}
	eventually(t, 5*time.Second, "a Skipped Event on the Job", func() (bool, string) {
		return hasEvent(t, ns, "report", locksv1alpha1.EventSkipped)
	})

	// Ended for good: when the lock is free, it is not started.
	complete(t, c, h)
	create(t, makeJob("after", ns).lock("billing").obj())
	waitRunning(t, c, 10*time.Second, ns, "after")
	if j := getJob(t, c, ns, "report"); running(j) || j.Annotations[locksv1alpha1.AnnotationFencingToken] != "" {
		t.Fatalf("the skipped Job was started: %v", j.Annotations)
	}
}

// TestMaxHoldersRunsThatManyJobsAtOnce: a lock with maxHolders 2 runs two
// Jobs at once, with rising tokens, and the third when one ends; on each
// store that runs here as a process (every store has semaphores; the
// kubernetes store has its own suites).
func TestMaxHoldersRunsThatManyJobsAtOnce(t *testing.T) {
	startManager(t, managerOptions{})
	for _, sc := range storeCases { // redis, postgres, zookeeper, etcd
		t.Run(sc.name, func(t *testing.T) {
			ns := newNamespace(t, nil)
			c := env.Client
			sc.setup(t, ns)
			dl := makeLock("exports", ns).obj()
			dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: "store"}}
			dl.Spec.MaxHolders = 2
			create(t, dl)
			a := makeJob("a", ns).lock("exports").obj()
			create(t, a)
			ja := waitRunning(t, c, 10*time.Second, ns, "a")
			create(t, makeJob("b", ns).lock("exports").obj())
			jb := waitRunning(t, c, 10*time.Second, ns, "b")
			if fence(t, jb) <= fence(t, ja) {
				t.Errorf("b's fencing token %d is not larger than a's %d", fence(t, jb), fence(t, ja))
			}
			create(t, makeJob("c", ns).lock("exports").obj())
			waitPosition(t, ns, "c", "1/1")

			complete(t, c, ja)
			waitRunning(t, c, 10*time.Second, ns, "c")
			if !running(getJob(t, c, ns, "b")) {
				t.Fatal("b stopped running")
			}
		})
	}
}

func TestDescribeWait(t *testing.T) {
	t.Parallel()
	h := holder.Holder{Cluster: "east", Namespace: "ns", Lock: "billing", Kind: "Job", Name: "report-1", UID: "abcdef", Identity: "east/ns/Job/report-1/abcde"}
	tests := map[string]struct {
		busy                     lock.HeldError
		wantPosition, wantReason string
	}{
		"next, behind the holder": {
			busy:         lock.HeldError{Key: "k", Holder: h.Encode(), Fence: 7, Position: 0, Waiters: 3},
			wantPosition: "1/3", wantReason: "held by east/ns/Job/report-1/abcde (fencing token 7)",
		},
		"third": {
			busy:         lock.HeldError{Key: "k", Holder: h.Encode(), Fence: 7, Position: 2, Waiters: 3},
			wantPosition: "3/3", wantReason: "held by east/ns/Job/report-1/abcde (fencing token 7), 2 waiter(s) ahead",
		},
		"free, but others ahead": {
			busy:         lock.HeldError{Key: "k", Position: 2, Waiters: 7},
			wantPosition: "3/7", wantReason: "2 waiter(s) ahead",
		},
		"a semaphore's holders": {
			busy:         lock.HeldError{Key: "k", Holder: h.Encode(), Fence: 7, Holders: 3, Position: 0, Waiters: 1},
			wantPosition: "1/1", wantReason: "held by east/ns/Job/report-1/abcde (fencing token 7) and 2 other holder(s)",
		},
		"not queued": {
			busy:         lock.HeldError{Key: "k", Holder: h.Encode(), Fence: 7, Position: -1},
			wantPosition: "", wantReason: "held by east/ns/Job/report-1/abcde (fencing token 7)",
		},
		"an older engine's queue length that misses the caller": {
			busy:         lock.HeldError{Key: "k", Position: 1},
			wantPosition: "2/2", wantReason: "1 waiter(s) ahead",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pos, why := describeWait(&tc.busy)
			if pos != tc.wantPosition || why != tc.wantReason {
				t.Errorf("describeWait = %q, %q; want %q, %q", pos, why, tc.wantPosition, tc.wantReason)
			}
		})
	}
}

func TestMaxWait(t *testing.T) {
	t.Parallel()
	created := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	tests := map[string]struct {
		annotation string
		lockSecs   int32
		want       time.Duration
	}{
		"no bound":                         {want: 0},
		"the lock's":                       {lockSecs: 600, want: 10 * time.Minute},
		"the annotation's":                 {annotation: "45m", want: 45 * time.Minute},
		"the annotation wins, longer":      {annotation: "2h", lockSecs: 600, want: 2 * time.Hour},
		"the annotation wins, shorter":     {annotation: "30s", lockSecs: 600, want: 30 * time.Second},
		"a bad annotation is ignored":      {annotation: "soon", lockSecs: 600, want: 10 * time.Minute},
		"a zero annotation is ignored":     {annotation: "0s", want: 0},
		"a negative annotation is ignored": {annotation: "-1m", lockSecs: 60, want: time.Minute},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}}
			if tc.annotation != "" {
				job.Annotations = map[string]string{locksv1alpha1.AnnotationMaxWait: tc.annotation}
			}
			dl := &locksv1alpha1.DistributedLock{Spec: locksv1alpha1.DistributedLockSpec{MaxWaitSeconds: tc.lockSecs}}
			limit, deadline := maxWait(job, dl)
			if limit != tc.want {
				t.Fatalf("maxWait = %v, want %v", limit, tc.want)
			}
			if limit > 0 && !deadline.Equal(created.Add(limit)) {
				t.Errorf("deadline = %v, want creation + %v", deadline, limit)
			}
		})
	}
}

func TestEndedWithoutRunningIsDone(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		cond batchv1.JobCondition
		want jobPhase
	}{
		"skipped":        {batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonSkipped}, phaseDone},
		"wait timed out": {batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonWaitTimedOut}, phaseDone},
		"superseded":     {batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonSuperseded}, phaseDone},
		// A running Job's pod failure policy: its pods may still run; the
		// lease is released when the Job is Failed.
		"another FailureTarget": {batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonPodFailurePolicy}, phaseHolding},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			job := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
				Status:     batchv1.JobStatus{Conditions: []batchv1.JobCondition{tc.cond}},
			}
			if tc.want == phaseHolding {
				job.Annotations[locksv1alpha1.AnnotationFencingToken] = "7"
			}
			if got := phaseOf(job); got != tc.want {
				t.Errorf("phaseOf = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestWaitMemoryReportsAPositionOnce(t *testing.T) {
	t.Parallel()
	m := newWaitMemory()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	var changed []bool
	for _, p := range []string{"3/7", "3/7", "2/7", "2/7", "2/6"} {
		changed = append(changed, m.positionChanged(a, p))
	}
	if want := []bool{true, false, true, false, true}; !slices.Equal(changed, want) {
		t.Errorf("positionChanged = %v, want %v", changed, want)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-1"}}
	m.markEnded(job)
	if !m.hasEnded(job) {
		t.Error("an ended Job is not remembered as ended")
	}
	again := job.DeepCopy()
	again.UID = "uid-2"
	if m.hasEnded(again) {
		t.Error("a new Job of the same name counts as ended")
	}
	m.forget(a)
	if m.hasEnded(job) || !m.positionChanged(a, "2/6") {
		t.Error("forget left something behind")
	}
	var none *waitMemory
	if !none.positionChanged(a, "1/1") || none.hasEnded(job) {
		t.Error("a nil waitMemory should remember nothing")
	}
}

func TestQueuePositionChangedByOthersIsRestored(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("holder", ns).lock("billing").obj())
	waitRunning(t, c, 10*time.Second, ns, "holder")
	create(t, makeJob("waiter", ns).lock("billing").obj())
	w := waitPosition(t, ns, "waiter", "1/1")
	heldBy := w.Annotations[locksv1alpha1.AnnotationWaitingFor]

	// Someone claims the Job is first of many.
	w.Annotations[locksv1alpha1.AnnotationQueuePosition] = "1/99"
	w.Annotations[locksv1alpha1.AnnotationWaitingFor] = "nobody"
	if err := c.Update(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	eventually(t, waitTimeout, "the waiting annotations to be restored", func() (bool, string) {
		j := getJob(t, c, ns, "waiter")
		return j.Annotations[locksv1alpha1.AnnotationQueuePosition] == "1/1" && j.Annotations[locksv1alpha1.AnnotationWaitingFor] == heldBy, fmt.Sprint(j.Annotations)
	})
	eventually(t, 5*time.Second, "a Tampered Event on the Job", func() (bool, string) {
		ok, e := hasEvent(t, ns, "waiter", locksv1alpha1.EventTampered)
		return ok && strings.Contains(e, "place in the queue"), e
	})
}

func TestWaitMemoryTellsTamperingFromALaggingCache(t *testing.T) {
	t.Parallel()
	nn := types.NamespacedName{Namespace: "ns", Name: "a"}
	first, second, third := waitShown{"3/3", "x"}, waitShown{"2/2", "y"}, waitShown{"1/1", "z"}
	m := newWaitMemory()
	if m.tampered(nn, waitShown{"9/9", "forged"}, first) {
		t.Error("before the operator wrote anything, nothing counts as tampered")
	}
	m.wroteShown(nn, first)
	m.wroteShown(nn, second)
	for name, tc := range map[string]struct {
		seen waitShown
		want bool
	}{
		"what it wrote last":                {second, false},
		"what it wrote before (cache lags)": {first, false},
		"what it writes now":                {third, false},
		"removed by someone":                {waitShown{}, true},
		"forged":                            {waitShown{"1/99", "nobody"}, true},
	} {
		if got := m.tampered(nn, tc.seen, third); got != tc.want {
			t.Errorf("%s: tampered = %v, want %v", name, got, tc.want)
		}
	}
}

func TestSyncedAnnotationsCarryTheMaxWait(t *testing.T) {
	t.Parallel()
	cj := func(ann, tmpl map[string]string) *batchv1.CronJob {
		c := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}
		c.Spec.JobTemplate.Annotations = tmpl
		return c
	}
	synced := locksv1alpha1.AnnotationSyncedFromCronJob
	tests := map[string]struct {
		cj   *batchv1.CronJob
		want map[string]string
	}{
		"lock, contention and max wait": {
			cj: cj(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: "QueueLatest", locksv1alpha1.AnnotationMaxWait: "45m"}, nil),
			want: map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: "QueueLatest",
				locksv1alpha1.AnnotationMaxWait: "45m", synced: "true"},
		},
		"lock only": {
			cj:   cj(map[string]string{locksv1alpha1.AnnotationLock: "billing"}, nil),
			want: map[string]string{locksv1alpha1.AnnotationLock: "billing", synced: "true"},
		},
		"lock removed: the synced ones go": {
			cj:   cj(nil, map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationMaxWait: "45m", synced: "true"}),
			want: map[string]string{},
		},
		"the user's own template annotations stay": {
			cj: cj(nil, map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationMaxWait: "45m"}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := syncedAnnotations(tc.cj)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("syncedAnnotations (-want,+got):\n%s", diff)
			}
			if tc.want != nil && !needsSync(tc.cj.Spec.JobTemplate.Annotations, got) {
				t.Errorf("needsSync(%v, %v) says nothing to do", tc.cj.Spec.JobTemplate.Annotations, got)
			}
		})
	}
}
