package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestStatusListsLocksWithHolderQueueAndBackend(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("billing", ns).create(ctx, t)
	makeLock("exports", ns).clusterBackend("shared-redis").create(ctx, t)
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		held(dl, "default/"+ns+"/Job/ledger-1/9c1d0", 1796029117064694, time.Now().Add(-5*time.Minute))
		dl.Status.QueueLength = ptr.To[int32](2)
	})
	setStatus(ctx, t, ns, "exports", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree, "nobody holds the keys")
		setCondition(dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionFalse, locksv1alpha1.ReasonBackendUnreachable, "dial tcp: connection refused")
	})

	got := rows(mustRun(ctx, t, "status", "-n", ns))
	want := [][]string{
		{"NAME", "KEYS", "HOLDER", "FENCE", "QUEUE", "BACKEND", "READY", "AGE"},
		{"billing", "billing/main", "default/" + ns + "/Job/ledger-1/9c1d0", "1796029117064694", "2", "redis/redis.infra:6379", "Reachable"},
		{"exports", "exports/main", "<none>", "<none>", "0", "ClusterLockBackend/shared-redis", "Unreachable"},
	}
	for i := range got[1:] {
		got[i+1] = got[i+1][:len(got[i+1])-1] // AGE depends on the clock
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status table (-want,+got):\n%s", diff)
	}

	wide := rows(mustRun(ctx, t, "status", "-n", ns, "-o", "wide"))
	if diff := cmp.Diff([]string{"NAME", "KEYS", "HOLDER", "FENCE", "QUEUE", "BACKEND", "READY", "AGE", "HELD", "SLOTS", "MANUAL-HOLDER", "EXPIRES"}, wide[0]); diff != "" {
		t.Errorf("wide header (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Acquired", "1/1", "<none>", "<none>"}, wide[1][8:]); diff != "" {
		t.Errorf("wide columns of billing (-want,+got):\n%s", diff)
	}

	var list locksv1alpha1.DistributedLockList
	if err := json.Unmarshal([]byte(mustRun(ctx, t, "status", "-n", ns, "-o", "json")), &list); err != nil {
		t.Fatalf("-o json does not unmarshal into a DistributedLockList: %v", err)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "billing" || list.Items[0].Status.FencingToken != 1796029117064694 || list.Items[0].Kind != "DistributedLock" {
		t.Errorf("-o json: got %+v, want billing (fencing token 1796029117064694, kind DistributedLock) and exports", list.Items)
	}
	var one locksv1alpha1.DistributedLock
	if err := yaml.Unmarshal([]byte(mustRun(ctx, t, "status", "exports", "-n", ns, "-o", "yaml")), &one); err != nil {
		t.Fatalf("-o yaml does not unmarshal into a DistributedLock: %v", err)
	}
	if one.Name != "exports" || one.APIVersion != locksv1alpha1.GroupVersion.String() || one.Spec.Backend.ClusterBackendRef == nil {
		t.Errorf("-o yaml of exports: got %+v", one)
	}

	all := rows(mustRun(ctx, t, "status", "-A"))
	if all[0][0] != "NAMESPACE" || !slices.ContainsFunc(all, func(r []string) bool { return r[0] == ns && r[1] == "billing" }) {
		t.Errorf("status -A: want a NAMESPACE column and %s billing, got %q", ns, all)
	}

	wantError(t, run(ctx, t, "status", "-n", ns, "-o", "table"), `--output "table"`, "wide", "json", "yaml")
	wantError(t, run(ctx, t, "status", "nope", "-n", ns), `lock "nope" not found in namespace "`+ns+`"`, "its locks: billing, exports")
}

func TestKubeconfigContextAndNamespaceAreHonoured(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	makeLock("in-team-a", namespaceA).create(ctx, t)
	makeLock("in-team-b", namespaceB).create(ctx, t)

	names := func(args ...string) []string {
		var out []string
		for _, r := range rows(mustRun(ctx, t, args...))[1:] {
			out = append(out, r[0])
		}
		return out
	}
	for name, tc := range map[string]struct {
		args []string
		want []string
	}{
		"current context's namespace":     {args: []string{"status"}, want: []string{"in-team-a"}},
		"--context selects its namespace": {args: []string{"--context", contextB, "status"}, want: []string{"in-team-b"}},
		"-n wins over the context":        {args: []string{"--context=" + contextB, "status", "-n", namespaceA}, want: []string{"in-team-a"}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, names(tc.args...)); diff != "" {
				t.Errorf("locks listed (-want,+got):\n%s", diff)
			}
		})
	}
	wantError(t, run(ctx, t, "--context", "team-c", "status"), `context "team-c" does not exist`)
	missing := filepath.Join(t.TempDir(), "missing")
	wantError(t, run(ctx, t, "--kubeconfig", missing, "status"), missing)
	wantError(t, run(ctx, t, "queue", "in-team-b"), `lock "in-team-b" not found in namespace "team-a"`)
}

func TestQueueShowsWaitersFromStatusAndJobs(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("billing", ns).create(ctx, t)
	holderJob := createJob(ctx, t, ns, "ledger-1", "billing", false, nil)
	first := createJob(ctx, t, ns, "report-2", "billing", true, nil)
	// A Job past the 10 waiters that status.waiting lists: only its
	// annotation shows where it is.
	late := createJob(ctx, t, ns, "report-12", "billing", true, nil)
	annotateJob(ctx, t, first, map[string]string{locksv1alpha1.AnnotationQueuePosition: "1/12"})
	annotateJob(ctx, t, late, map[string]string{locksv1alpha1.AnnotationQueuePosition: "12/12"})
	now := time.Now()
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		held(dl, jobIdentity(holderJob), 17, now.Add(-10*time.Minute))
		dl.Status.QueueLength = ptr.To[int32](12)
		dl.Status.Waiting = []locksv1alpha1.WaiterStatus{
			// Over 10 minutes: kubectl's durations show seconds below
			// that, and status times are kept to the second.
			{Identity: jobIdentity(first), Since: ptr.To(metav1.NewTime(now.Add(-14 * time.Minute)))},
			{Identity: "maintenance-2026-12-01", Since: ptr.To(metav1.NewTime(now.Add(-13 * time.Minute)))},
		}
	})

	out := mustRun(ctx, t, "queue", "billing", "-n", ns)
	if want := fmt.Sprintf("Lock %s/billing (keys billing/main): held by %s with fencing token 17 for 10m.", ns, jobIdentity(holderJob)); !strings.Contains(out, want) {
		t.Errorf("queue does not say who holds the lock: want %q in\n%s", want, out)
	}
	if !strings.Contains(out, "12 waiting, 3 shown") {
		t.Errorf("queue does not say how many wait and how many it shows:\n%s", out)
	}
	var table [][]string
	for _, r := range rows(out) {
		if r[0] == "POSITION" || (len(r) == 5 && r[0] != "" && r[0][0] >= '0' && r[0][0] <= '9') {
			table = append(table, r)
		}
	}
	want := [][]string{
		{"POSITION", "WAITER", "JOB", "WAITING", "SOURCE"},
		{"1", jobIdentity(first), "report-2", "14m", "status"},
		{"2", "maintenance-2026-12-01", "<none>", "13m", "status"},
		{"12", "Job/report-12", "report-12"},
	}
	if len(table) == 4 {
		table[3] = table[3][:3] // the Job's age depends on the clock
	}
	if diff := cmp.Diff(want, table); diff != "" {
		t.Errorf("queue rows (-want,+got):\n%s", diff)
	}
	if !strings.Contains(out, "status: the lock's status.waiting") || !strings.Contains(out, "job: the Job's lockwarden.io/queue-position annotation") {
		t.Errorf("queue does not say where its data comes from:\n%s", out)
	}

	makeLock("idle", ns).create(ctx, t)
	setStatus(ctx, t, ns, "idle", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonFree, "nobody holds the keys")
	})
	if out := mustRun(ctx, t, "queue", "idle", "-n", ns); !strings.Contains(out, "nobody holds it") || !strings.Contains(out, "Nobody waits") {
		t.Errorf("queue of a free lock:\n%s", out)
	}
	wantError(t, run(ctx, t, "queue", "-n", ns), "LOCK is required")
}

func TestWhyExplainsAJob(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("billing", ns).create(ctx, t)
	holderJob := createJob(ctx, t, ns, "ledger-1", "billing", false, nil)
	annotateJob(ctx, t, holderJob, map[string]string{
		locksv1alpha1.AnnotationHolder:       jobIdentity(holderJob),
		locksv1alpha1.AnnotationFencingToken: "17",
	})
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		// 20 minutes: kubectl's duration shows whole minutes from 10 on, so a
		// slow test run does not turn "20m" into "20m1s" (2m did).
		held(dl, jobIdentity(holderJob), 17, time.Now().Add(-20*time.Minute))
		dl.Status.QueueLength = ptr.To[int32](2)
	})
	waiting := createJob(ctx, t, ns, "report-2", "billing", true, nil)
	annotateJob(ctx, t, waiting, map[string]string{
		locksv1alpha1.AnnotationQueuePosition: "2/2",
		locksv1alpha1.AnnotationWaitingFor:    "held by " + jobIdentity(holderJob) + " (fencing token 17); 1 waiter ahead",
	})
	createJob(ctx, t, ns, "report-3", "billing", true, nil)
	createJob(ctx, t, ns, "report-skip", "billing", true, map[string]string{
		locksv1alpha1.AnnotationSkipped: "lock billing is held by " + jobIdentity(holderJob) + " (fencing token 17)",
	})
	createJob(ctx, t, ns, "report-lost", "billing", false, map[string]string{
		locksv1alpha1.AnnotationLost:         "2026-12-01T10:00:00Z: the lease expired during a backend outage",
		locksv1alpha1.AnnotationFencingToken: "12",
	})
	cancelledJob := createJob(ctx, t, ns, "report-cancelled", "billing", false, map[string]string{locksv1alpha1.AnnotationFencingToken: "15"})
	now := metav1.Now()
	cancelledJob.Status.StartTime = &now
	cancelledJob.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: locksv1alpha1.JobReasonCancelled,
		Message: "A newer Job of lock billing asked for its key (contention CancelInProgress)", LastProbeTime: now, LastTransitionTime: now}}
	if err := env.Client.Status().Update(ctx, cancelledJob); err != nil {
		t.Fatalf("cancel Job report-cancelled: %v", err)
	}
	createJob(ctx, t, ns, "plain", "", true, nil)
	makeLock("idle", ns).create(ctx, t)
	createJob(ctx, t, ns, "idle-1", "idle", true, map[string]string{locksv1alpha1.AnnotationQueuePosition: "1/1"})

	for name, want := range map[string][]string{
		"ledger-1": {
			fmt.Sprintf("Job %s/ledger-1 is not suspended: it holds lock billing as %s with fencing token 17", ns, jobIdentity(holderJob)),
		},
		"report-2": {
			fmt.Sprintf("Job %s/report-2 is suspended by lockwarden: it waits for lock billing, position 2 of 2 in the queue", ns),
			"It waits behind: held by " + jobIdentity(holderJob) + " (fencing token 17); 1 waiter ahead",
			"Lock billing (keys billing/main) is held by " + jobIdentity(holderJob) + " with fencing token 17 for 20m.",
		},
		"report-3": {
			"it waits for lock billing, and the operator has not placed it in the queue yet",
		},
		"report-skip": {
			fmt.Sprintf("Job %s/report-skip did not run: lock billing is held by %s (fencing token 17), and its contention is Skip", ns, jobIdentity(holderJob)),
		},
		"report-lost": {
			fmt.Sprintf("Job %s/report-lost lost its lease on lock billing", ns),
			"the lease expired during a backend outage",
			"It held the lock with fencing token 12",
			"The lock's onLost is Ignore",
		},
		"report-cancelled": {
			fmt.Sprintf("Job %s/report-cancelled was cancelled: a newer Job of lock billing with contention CancelInProgress asked for its key while it ran with fencing token 15.", ns),
			"Its pods are being stopped (within their termination grace period); the lock is released once they have",
		},
		"idle-1": {
			"Lock idle (keys idle/main) is free: nobody holds it.",
		},
		"plain": {
			fmt.Sprintf("Job %s/plain is not gated by lockwarden: it has no lockwarden.io/lock annotation.", ns),
			"It is suspended (spec.suspend is true), but not by lockwarden",
		},
	} {
		t.Run(name, func(t *testing.T) {
			out := mustRun(ctx, t, "why", name, "-n", ns)
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("why %s does not say %q:\n%s", name, w, out)
				}
			}
		})
	}
	wantError(t, run(ctx, t, "why", "nope", "-n", ns), `job "nope" not found in namespace "`+ns+`"`)
}

func TestHoldSetsTheManualHolderAndWaits(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	created := makeLock("billing", ns).create(ctx, t)

	wantError(t, run(ctx, t, "hold", "billing", "-n", ns), "--as is required")
	wantError(t, run(ctx, t, "hold", "billing", "-n", ns, "--as", "m", "--until", "tomorrow"), `--until "tomorrow" is not an RFC 3339 time`)
	wantError(t, run(ctx, t, "hold", "nope", "-n", ns, "--as", "m"), `lock "nope" not found in namespace "`+ns+`"`)

	// --wait returns once the operator reports ManualHolderHeld True for the change.
	done := make(chan result, 1)
	go func() {
		done <- run(ctx, t, "hold", "billing", "-n", ns, "--as", "maintenance-2026-12-01", "--wait", "--timeout", "1m")
	}()
	dl := waitForLock(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) bool { return dl.Spec.Holder != nil })
	if diff := cmp.Diff(&locksv1alpha1.ManualHolder{Identity: "maintenance-2026-12-01"}, dl.Spec.Holder); diff != "" {
		t.Errorf("spec.holder after hold (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(created.Spec.Keys, dl.Spec.Keys); diff != "" || dl.Spec.TTLSeconds != created.Spec.TTLSeconds || dl.Spec.Backend.Redis == nil {
		t.Errorf("hold changed other fields of the spec: %+v", dl.Spec)
	}
	if !slices.ContainsFunc(dl.ManagedFields, func(m metav1.ManagedFieldsEntry) bool { return m.Manager == "kubectl-lockwarden" }) {
		t.Errorf("no managedFields entry of kubectl-lockwarden: %+v", dl.ManagedFields)
	}
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired, "maintenance-2026-12-01 holds the keys")
	})
	r := <-done
	if r.err != nil {
		t.Fatalf("hold --wait: %v", r.err)
	}
	if !strings.Contains(r.out, "ManualHolderHeld=True (Acquired): maintenance-2026-12-01 holds the keys") {
		t.Errorf("hold --wait does not show the condition it waited for:\n%s", r.out)
	}

	wantError(t, run(ctx, t, "hold", "billing", "-n", ns, "--as", "someone-else"),
		`already has the manual holder "maintenance-2026-12-01"`, "unhold it first")

	// unhold removes spec.holder, and --wait returns once the operator has released it.
	go func() { done <- run(ctx, t, "unhold", "billing", "-n", ns, "--wait", "--timeout", "1m") }()
	waitForLock(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) bool { return dl.Spec.Holder == nil })
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNoManualHolder, "spec.holder is not set")
	})
	if r := <-done; r.err != nil || !strings.Contains(r.out, `manual holder "maintenance-2026-12-01" removed`) {
		t.Fatalf("unhold --wait: %v\n%s", r.err, r.out)
	}
	if out := mustRun(ctx, t, "unhold", "billing", "-n", ns); !strings.Contains(out, "has no manual holder (spec.holder is not set): nothing to remove") {
		t.Errorf("unhold without a manual holder:\n%s", out)
	}
}

func TestHoldWaitTimesOutWithTheReason(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("billing", ns).create(ctx, t)

	done := make(chan result, 1)
	go func() {
		done <- run(ctx, t, "hold", "billing", "-n", ns, "--as", "window", "--max-hold", "1h", "--wait", "--timeout", "3s")
	}()
	dl := waitForLock(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) bool { return dl.Spec.Holder != nil })
	if diff := cmp.Diff(&locksv1alpha1.ManualHolder{Identity: "window", MaxHoldSeconds: 3600}, dl.Spec.Holder); diff != "" {
		t.Errorf("spec.holder after hold --max-hold 1h (-want,+got):\n%s", diff)
	}
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		setCondition(dl, locksv1alpha1.ConditionManualHolderHeld, metav1.ConditionFalse, locksv1alpha1.ReasonWaiting, "queued behind default/x/Job/ledger-1/9c1d0 (fencing token 17)")
	})
	r := <-done
	wantError(t, r, `timed out after 3s waiting for manual holder "window" to hold lock "billing"`,
		"ManualHolderHeld is False, reason Waiting: queued behind default/x/Job/ledger-1/9c1d0 (fencing token 17)")

	// Nobody reports on the change at all: the timeout says so.
	makeLock("unwatched", ns).create(ctx, t)
	wantError(t, run(ctx, t, "hold", "unwatched", "-n", ns, "--as", "window", "--wait", "--timeout", "1s"),
		"the operator has not reported ManualHolderHeld", "is it running?")
}

func TestReleaseForceSetsTheAuditedAnnotation(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	makeLock("billing", ns).create(ctx, t)
	makeLock("free", ns).create(ctx, t)
	setStatus(ctx, t, ns, "billing", func(dl *locksv1alpha1.DistributedLock) {
		held(dl, "default/"+ns+"/Job/ledger-1/9c1d0", 1796029117064694, time.Now())
	})

	wantError(t, run(ctx, t, "release", "billing", "-n", ns), "add --force to confirm")
	wantError(t, run(ctx, t, "release", "free", "-n", ns, "--force"), `lock "free" in namespace "`+ns+`" has no holder`)
	wantError(t, run(ctx, t, "release", "billing", "-n", ns, "--force", "--token", "5"),
		`no holder of lock "billing" has fencing token 5; its holders: 1796029117064694 (default/`+ns+`/Job/ledger-1/9c1d0)`)
	if _, asked := getLock(ctx, t, ns, "billing").Annotations[locksv1alpha1.AnnotationForceRelease]; asked {
		t.Fatal("a refused release set the force-release annotation")
	}

	out := mustRun(ctx, t, "release", "billing", "-n", ns, "--force")
	for _, w := range []string{
		"annotated lockwarden.io/force-release=1796029117064694",
		"Asked the operator to release the lease of default/" + ns + "/Job/ledger-1/9c1d0 (fencing token 1796029117064694)",
		"records who asked in lockwarden.io/force-release-by",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("release --force does not say %q:\n%s", w, out)
		}
	}
	dl := getLock(ctx, t, ns, "billing")
	if got := dl.Annotations[locksv1alpha1.AnnotationForceRelease]; got != "1796029117064694" {
		t.Errorf("lockwarden.io/force-release = %q, want the holder's fencing token 1796029117064694", got)
	}
	if by, set := dl.Annotations[locksv1alpha1.AnnotationForceReleaseBy]; set {
		t.Errorf("the plugin set lockwarden.io/force-release-by=%q: only the webhook may", by)
	}
	wantError(t, run(ctx, t, "release", "billing", "-n", ns, "--force"), "already has a force release of fencing token 1796029117064694 pending")

	// A semaphore's holder is named by its token.
	makeLock("exports", ns).create(ctx, t)
	setStatus(ctx, t, ns, "exports", func(dl *locksv1alpha1.DistributedLock) {
		held(dl, "default/"+ns+"/Job/export-1/aaaaa", 21, time.Now())
		second := dl.Status.Holders[0]
		second.Identity, second.Name, second.FencingToken = "default/"+ns+"/Job/export-2/bbbbb", "export-2", 22
		dl.Status.Holders = append(dl.Status.Holders, second)
		dl.Status.HolderCount = ptr.To[int32](2)
	})
	wantError(t, run(ctx, t, "release", "exports", "-n", ns, "--force"),
		`lock "exports" has several holders: name one with --token; its holders: 21 (default/`+ns+`/Job/export-1/aaaaa), 22 (default/`+ns+`/Job/export-2/bbbbb)`)
	mustRun(ctx, t, "release", "exports", "-n", ns, "--force", "--token", "22")
	if got := getLock(ctx, t, ns, "exports").Annotations[locksv1alpha1.AnnotationForceRelease]; got != "22" {
		t.Errorf("lockwarden.io/force-release = %q after --token 22", got)
	}
}

func TestVersion(t *testing.T) {
	// Needs no API server.
	r := run(context.Background(), t, "version")
	if r.err != nil || !strings.HasPrefix(r.out, "kubectl-lockwarden ") || !strings.Contains(r.out, "locks.lockwarden.io/v1alpha1") {
		t.Errorf("version: %v\n%s", r.err, r.out)
	}
}

// waitForLock polls the lock until ok holds for it, or fails the test.
func waitForLock(ctx context.Context, t testing.TB, ns, name string, ok func(*locksv1alpha1.DistributedLock) bool) *locksv1alpha1.DistributedLock {
	t.Helper()
	var dl *locksv1alpha1.DistributedLock
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		dl = getLock(ctx, t, ns, name)
		return ok(dl), nil
	})
	if err != nil {
		t.Fatalf("lock %s/%s never got there: %v (last: %+v)", ns, name, err, dl.Spec)
	}
	return dl
}
