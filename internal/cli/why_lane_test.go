package cli_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// deriving makes the lock derive a key from each workload's env label
// instead of locking fixed keys.
func (b *lockBuilder) deriving() *lockBuilder {
	b.dl.Spec.Keys = nil
	b.dl.Spec.KeyFrom = &locksv1alpha1.KeyFrom{Expression: `"deploy/" + object.metadata.labels["env"]`}
	return b
}

// laneJob creates a Job of lock deploys that the webhook gave key: waiting
// (suspended) with the annotations given, or, with a fencing token among
// them, holding the key since it started `running` ago.
func laneJob(ctx context.Context, t testing.TB, ns, name, key string, running time.Duration, annotations map[string]string) *batchv1.Job {
	t.Helper()
	a := map[string]string{locksv1alpha1.AnnotationKey: key}
	for k, v := range annotations {
		a[k] = v
	}
	holding := a[locksv1alpha1.AnnotationFencingToken] != ""
	job := createJob(ctx, t, ns, name, "deploys", !holding, a)
	if holding {
		job.Status.StartTime = ptr.To(metav1.NewTime(time.Now().Add(-running)))
		if err := env.Client.Status().Update(ctx, job); err != nil {
			t.Fatalf("start Job %s: %v", name, err)
		}
	}
	return job
}

// lanePod creates a Pod of lock deploys that the webhook gave key: gated
// with the annotations given, or, with a fencing token among them, running
// since `running` ago.
func lanePod(ctx context.Context, t testing.TB, ns, name, key string, running time.Duration, annotations map[string]string) {
	t.Helper()
	a := map[string]string{locksv1alpha1.AnnotationLock: "deploys", locksv1alpha1.AnnotationKey: key, locksv1alpha1.AnnotationHolderMode: "Pod"}
	for k, v := range annotations {
		a[k] = v
	}
	holding := a[locksv1alpha1.AnnotationFencingToken] != ""
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: a, Labels: map[string]string{locksv1alpha1.LabelLock: "deploys"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	if !holding {
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: locksv1alpha1.SchedulingGate}}
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create Pod %s: %v", name, err)
	}
	if holding {
		pod.Status.Phase = corev1.PodRunning
		pod.Status.StartTime = ptr.To(metav1.NewTime(time.Now().Add(-running)))
		if err := env.Client.Status().Update(ctx, pod); err != nil {
			t.Fatalf("start Pod %s: %v", name, err)
		}
	}
}

// waited is the first waiter's wait in why --key, which counts from its
// creation moments ago.
var waited = regexp.MustCompile(`has waited [0-9ms]+, since`)

// createLanes creates, in a namespace of its own, lock deploys deriving
// its keys with status.lanes as the operator writes it, and the Jobs and
// Pods of its lanes: deploy/prod held by Job prod-1 (returned) and awaited
// by Job prod-2 and Pod prod-canary, in that order; deploy/dev held by Job
// dev-1; deploy/web held by Deployment web for its Pods web-a and web-b;
// deploy/stage awaited by six Jobs not placed in its queue yet; deploy/eu
// held in another cluster.
func createLanes(ctx context.Context, t testing.TB) (string, *batchv1.Job) {
	t.Helper()
	ns := newNamespace(ctx, t)
	makeLock("deploys", ns).deriving().clusterBackend("shared-redis").create(ctx, t)
	setStatus(ctx, t, ns, "deploys", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, "The backend answers")
		dl.Status.Lanes = &locksv1alpha1.LanesStatus{Keys: 4, Holders: 4, Waiting: 3, Busiest: []locksv1alpha1.LaneStatus{
			{Key: "deploy/prod", Holders: 1, Waiting: 2, FencingToken: 41},
			{Key: "deploy/dev", Holders: 1, Waiting: 1, FencingToken: 40},
			{Key: "deploy/eu", Holders: 1, FencingToken: 7},
		}}
	})
	holder := laneJob(ctx, t, ns, "prod-1", "deploy/prod", 20*time.Minute, map[string]string{locksv1alpha1.AnnotationFencingToken: "41"})
	annotateJob(ctx, t, holder, map[string]string{locksv1alpha1.AnnotationHolder: jobIdentity(holder)})
	// Listed after the Pod, but first in line: the queue's order wins.
	lanePod(ctx, t, ns, "prod-canary", "deploy/prod", 0, map[string]string{locksv1alpha1.AnnotationQueuePosition: "2/2"})
	laneJob(ctx, t, ns, "prod-2", "deploy/prod", 0, map[string]string{
		locksv1alpha1.AnnotationQueuePosition: "1/2",
		locksv1alpha1.AnnotationWaitingFor:    "held by " + jobIdentity(holder) + " (fencing token 41)",
	})
	laneJob(ctx, t, ns, "dev-1", "deploy/dev", 20*time.Minute, map[string]string{locksv1alpha1.AnnotationFencingToken: "40"})
	// A Deployment in holder mode Workload: its Pods share one lease.
	for _, name := range []string{"web-a", "web-b"} {
		lanePod(ctx, t, ns, name, "deploy/web", 4*time.Hour, map[string]string{
			locksv1alpha1.AnnotationHolderMode:   "Workload",
			locksv1alpha1.AnnotationWorkload:     "Deployment/web/0c6d1e2f-aaaa",
			locksv1alpha1.AnnotationFencingToken: "12",
			locksv1alpha1.AnnotationHolder:       "default/" + ns + "/Deployment/web/0c6d1",
		})
	}
	// More waiters than why names.
	for _, name := range []string{"stage-1", "stage-2", "stage-3", "stage-4", "stage-5", "stage-6"} {
		laneJob(ctx, t, ns, name, "deploy/stage", 0, nil)
	}
	return ns, holder
}

// TestWhyKeyExplainsALane: why LOCK --key K tells an on-call engineer who
// waits for one derived key of a lock and in which order, whom they wait
// behind, who holds the key with which fencing token and since when, how
// long the lane's queue is, what the cooldown and the backend add, and the
// lock's counts for all its lanes.
func TestWhyKeyExplainsALane(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns, holder := createLanes(ctx, t)
	lockLine := `Lock deploys (keys derived: "deploy/" + object.metadata.labels["env"]) is using 4 derived key(s), with 4 holder(s) and 3 waiting; busiest: deploy/prod (1 holding, 2 waiting) deploy/dev (1 holding, 1 waiting) deploy/eu (1 holding, 0 waiting).` + "\n"

	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"waiters in line behind a holder": {
			args: []string{"why", "deploys", "--key", "deploy/prod", "-n", ns},
			want: "2 Job(s) or Pod(s) of this namespace wait for key deploy/prod of lock deploys, in this order: Job/prod-2 (position 1 of 2), Pod/prod-canary (position 2 of 2).\n" +
				"The first, Job/prod-2, has waited <age>, since it was created.\n" +
				"It waits behind: held by " + jobIdentity(holder) + " (fencing token 41) (lockwarden.io/waiting-for).\n" +
				"Key deploy/prod is held by " + jobIdentity(holder) + " (Job/prod-1) with fencing token 41, for 20m since the Job started.\n" +
				"Its queue holds 2 waiter(s) (status.lanes.busiest, in every cluster sharing the store).\n" +
				lockLine,
		},
		"a workload's Pods hold one lease; the lane is not among the busiest": {
			args: []string{"why", "lock/deploys", "--key=deploy/web", "-n", ns},
			want: "Nothing of this namespace waits for key deploy/web of lock deploys.\n" +
				"Key deploy/web is held by default/" + ns + "/Deployment/web/0c6d1 (Pod/web-a, Pod/web-b) with fencing token 12, for 4h since the first of them started.\n" +
				lockLine,
		},
		"more waiters than it names, not in the queue yet": {
			args: []string{"why", "deploys", "--key", "deploy/stage", "-n", ns},
			want: "6 Job(s) or Pod(s) of this namespace wait for key deploy/stage of lock deploys, in this order: Job/stage-1, Job/stage-2, Job/stage-3, Job/stage-4, Job/stage-5, and 1 more.\n" +
				"The first, Job/stage-1, has waited <age>, since it was created.\n" +
				"No Job or Pod of this namespace holds key deploy/stage, and status.lanes has no counts for it (it is not among the busiest keys).\n" +
				"The operator has not placed them in its queue yet (no lockwarden.io/queue-position annotation).\n" +
				lockLine,
		},
		"held elsewhere": {
			args: []string{"why", "dlock/deploys", "--key", "deploy/eu", "-n", ns},
			want: "Nothing of this namespace waits for key deploy/eu of lock deploys.\n" +
				"No Job or Pod of this namespace holds key deploy/eu: status.lanes counts 1 holder(s) (newest fencing token 7), in another cluster or through another lock that derives the same key.\n" +
				"Its queue holds 0 waiter(s) (status.lanes.busiest, in every cluster sharing the store).\n" +
				lockLine,
		},
		"a lane nothing holds or waits for": {
			args: []string{"why", "deploys", "--key", "deploy/qa", "-n", ns},
			want: "Nothing holds or waits for key deploy/qa: no Job or Pod of lock deploys in namespace " + ns + " has lockwarden.io/key deploy/qa, and it is not among the busiest keys of status.lanes.\n" +
				lockLine,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := waited.ReplaceAllString(mustRun(ctx, t, tc.args...), "has waited <age>, since")
			if got != tc.want {
				t.Errorf("kubectl lockwarden %v printed:\n%s\nwant:\n%s", tc.args, got, tc.want)
			}
		})
	}

	// The backend stops answering, and the lock cools each key down after a
	// release: both keep the waiters waiting, and why says so.
	setStatus(ctx, t, ns, "deploys", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable, "dial tcp: connection refused")
	})
	dl := getLock(ctx, t, ns, "deploys")
	dl.Spec.CooldownSeconds = 120
	if err := env.Client.Update(ctx, dl); err != nil {
		t.Fatal(err)
	}
	out := mustRun(ctx, t, "why", "deploys", "--key", "deploy/prod", "-n", ns)
	want := "Its queue holds 2 waiter(s) (status.lanes.busiest, in every cluster sharing the store).\n" +
		"After each release the key stays held for spec.cooldownSeconds (120s): the first waiter starts that long after the holder is done, and status.lanes counts the cooling lease as a holder.\n" +
		lockLine +
		"Its backend ClusterLockBackend/shared-redis is not ready (Unreachable): dial tcp: connection refused\n" +
		"Until it answers, no waiter of any lane gets its turn, and status.lanes shows what the operator last observed.\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("why deploys --key deploy/prod with a cooldown and its backend down does not end with:\n%s\nit printed:\n%s", want, out)
	}
	// A key no Job or Pod here holds may be cooling down after its holder.
	want = "No Job or Pod of this namespace holds key deploy/eu: status.lanes counts 1 holder(s) (newest fencing token 7), in another cluster or through another lock that derives the same key, or a lease cooling down for spec.cooldownSeconds (120s) after its holder released it.\n"
	if out := mustRun(ctx, t, "why", "deploys", "--key", "deploy/eu", "-n", ns); !strings.Contains(out, want) {
		t.Errorf("why deploys --key deploy/eu with a cooldown does not say %q:\n%s", want, out)
	}
}

// TestWhyKeyRefusesWhatHasNoLane: --key names a lane of a lock that derives
// its keys; a lock with fixed keys, a Job, a Pod, an empty key or a missing
// lock are refused with what would be valid, and a lock named without
// --key is pointed to it.
func TestWhyKeyRefusesWhatHasNoLane(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("deploys", ns).deriving().create(ctx, t)
	makeLock("billing", ns).create(ctx, t)
	laneJob(ctx, t, ns, "prod-2", "deploy/prod", 0, map[string]string{locksv1alpha1.AnnotationQueuePosition: "1/1"})

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"why", "billing", "--key", "deploy/prod"},
			[]string{`--key "deploy/prod": lock "billing" has fixed keys (billing/main); --key selects one derived key of a lock with spec.keyFrom`}},
		{[]string{"why", "job/prod-2", "--key", "deploy/prod"},
			[]string{`--key "deploy/prod" explains a lane of a lock, and job/prod-2 is a Job: run why job/prod-2 without --key, or name the lock: why LOCK --key deploy/prod`}},
		{[]string{"why", "pod/prod-canary", "--key", "deploy/prod"},
			[]string{`--key "deploy/prod" explains a lane of a lock, and pod/prod-canary is a Pod: run why pod/prod-canary without --key, or name the lock: why LOCK --key deploy/prod`}},
		{[]string{"why", "svc/deploys", "--key", "deploy/prod"},
			[]string{`--key "deploy/prod" explains a lane of a lock: name the lock as LOCK or lock/LOCK, not "svc/deploys"`}},
		{[]string{"why", "deploys", "--key="},
			[]string{"--key needs a derived key: kubectl lockwarden why LOCK --key KEY, for example --key deploy/prod"}},
		{[]string{"why", "prod-2", "--key", "deploy/prod"},
			[]string{`lock "prod-2" not found in namespace "` + ns + `" (its locks: billing, deploys)`}},
		{[]string{"why", "--key", "deploy/prod"},
			[]string{`--key "deploy/prod" needs the lock whose lane it is: kubectl lockwarden why LOCK --key deploy/prod`}},
		{[]string{"why", "lock/deploys"},
			[]string{"why lock/deploys explains a lane of a lock with spec.keyFrom: add --key KEY; without it, why explains a Job or a Pod (JOB, job/NAME or pod/NAME)"}},
		{[]string{"why", "deploys"},
			[]string{`job "deploys" not found in namespace "` + ns + `", nor a pod of that name; deploys is a lock that derives its keys: why deploys --key KEY explains one of its lanes`}},
	} {
		wantError(t, run(ctx, t, append(tc.args, "-n", ns)...), tc.want...)
	}
	// Without --key a Job of a lane is explained as before; the operator
	// has not reported on the lock's lanes yet.
	out := mustRun(ctx, t, "why", "job/prod-2", "-n", ns)
	for _, w := range []string{
		"Job " + ns + "/prod-2 is suspended by lockwarden: it waits for lock deploys, position 1 of 1 in the queue",
		`Lock deploys (keys derived: "deploy/" + object.metadata.labels["env"]) has no status.lanes yet: the operator has not reported on its lanes.` + "\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("why job/prod-2 does not say %q:\n%s", w, out)
		}
	}
}

// TestStatusAndQueueKeyShowOneLane: against the API server, status LOCK
// --key K shows who holds the lane with which fencing token and how many
// wait, and queue LOCK --key K the lane's waiting Jobs in its order; neither
// shows another lane's Jobs or Pods.
func TestStatusAndQueueKeyShowOneLane(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns, holder := createLanes(ctx, t)

	status := mustRun(ctx, t, "status", "deploys", "--key", "deploy/prod", "-n", ns)
	for _, w := range []string{
		"Key deploy/prod is among the busiest keys of status.lanes: 1 holding (newest fencing token 41), 2 waiting (in every cluster sharing the store).\n" +
			"Held in this namespace by 1 holder(s):\n",
		"2 Job(s) or Pod(s) of this namespace wait for it; the first, Job/prod-2 (position 1 of 2), has waited ",
		"kubectl lockwarden why deploys --key deploy/prod says why they wait.\n",
	} {
		if !strings.Contains(status, w) {
			t.Errorf("status deploys --key deploy/prod does not say %q:\n%s", w, status)
		}
	}
	if got, want := tableAfter(status, "HOLDER"), [][]string{{"HOLDER", "FENCE", "HOLDING", "JOBS/PODS"}, {jobIdentity(holder), "41", "20m", "Job/prod-1"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("status deploys --key deploy/prod holders = %q, want %q", got, want)
	}
	web := mustRun(ctx, t, "status", "deploys", "--key", "deploy/web", "-n", ns)
	if got, want := tableAfter(web, "HOLDER"), [][]string{{"HOLDER", "FENCE", "HOLDING", "JOBS/PODS"}, {"default/" + ns + "/Deployment/web/0c6d1", "12", "4h", "Pod/web-a,Pod/web-b"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("status deploys --key deploy/web holders = %q, want %q", got, want)
	}

	queue := mustRun(ctx, t, "queue", "deploys", "--key", "deploy/prod", "-n", ns)
	if !strings.Contains(queue, "Key deploy/prod: 1 holding (newest fencing token 41), 2 waiting.\n"+
		"2 waiting, 1 shown: only this namespace's Jobs carry their place in the key's queue (kubectl lockwarden why deploys --key deploy/prod also names waiting Pods):\n") {
		t.Errorf("queue deploys --key deploy/prod does not give the lane's counts and why a Pod is missing:\n%s", queue)
	}
	queued := tableAfter(queue, "POSITION")
	if len(queued) != 2 || !slices.Equal(queued[1][:3], []string{"1", "Job/prod-2", "prod-2"}) || queued[1][4] != "job" {
		t.Errorf("queue deploys --key deploy/prod rows = %q, want Job/prod-2 at position 1 from its annotation", queued)
	}
	for _, out := range []string{status, queue} {
		if strings.Contains(out, "dev-1") || strings.Contains(out, "stage-") || strings.Contains(out, "web-a") {
			t.Errorf("--key deploy/prod shows another lane's workload:\n%s", out)
		}
	}
}

// tableAfter is the aligned table of a command's output whose header
// starts with first, split into cells, up to the blank line after it.
func tableAfter(out, first string) [][]string {
	var table [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case table == nil && len(f) > 0 && f[0] == first:
			table = append(table, f)
		case table != nil && len(f) == 0:
			return table
		case table != nil:
			table = append(table, f)
		}
	}
	return table
}
