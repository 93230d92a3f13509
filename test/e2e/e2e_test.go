//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// TestConfigDefaultAppliesToAPIServer renders config/default with the
// project's pinned kustomize (bin/kustomize, `make kustomize` builds it) and
// applies it with a server-side dry run: every object must be valid for
// this Kubernetes version. (The cluster itself runs with its RBAC and
// admission policy, applied for real.)
func TestConfigDefaultAppliesToAPIServer(t *testing.T) {
	kustomize, err := devcluster.Kustomize(t.Context(), cluster.Root)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := devcluster.RenderDefault(t.Context(), cluster.Root)
	if err != nil {
		t.Fatal(err)
	}
	out := kubectl(t, string(rendered), "apply", "--server-side", "--dry-run=server", "--force-conflicts", "--field-manager=e2e", "-f", "-")
	t.Logf("kubectl apply --server-side --dry-run=server:\n%s", out)
	for _, want := range []string{
		"customresourcedefinition.apiextensions.k8s.io/distributedlocks.locks.lockwarden.io",
		"customresourcedefinition.apiextensions.k8s.io/clusterlockbackends.locks.lockwarden.io",
		"deployment.apps/lockwarden-controller-manager",
		"mutatingwebhookconfiguration.admissionregistration.k8s.io/lockwarden-mutating-webhook-configuration",
		"clusterrole.rbac.authorization.k8s.io/lockwarden-manager-role",
		"validatingadmissionpolicy.admissionregistration.k8s.io/" + devcluster.JobGatePolicy,
		"validatingadmissionpolicybinding.admissionregistration.k8s.io/" + devcluster.JobGatePolicy,
	} {
		if !strings.Contains(out, want+" serverside-applied (server dry run)") {
			t.Errorf("the dry run does not show %s as applied", want)
		}
	}

	// The sample Redis manifests (1 server, 3 independent masters) apply too.
	ns := newNamespace(t, "e2e-redis")
	for _, dir := range []string{"standalone", "redlock"} {
		rendered, err := exec.Command(kustomize, "build", filepath.Join(cluster.Root, "config", "redis", dir)).Output()
		if err != nil {
			t.Fatalf("kustomize build config/redis/%s: %v", dir, err)
		}
		out := kubectl(t, string(rendered), "apply", "-n", ns, "--server-side", "--dry-run=server", "--field-manager=e2e", "-f", "-")
		if !strings.Contains(out, "statefulset.apps/redis") {
			t.Errorf("config/redis/%s: the dry run shows no StatefulSet:\n%s", dir, out)
		}
	}
}

// TestKubectlShowsLocks checks what `kubectl get`, `describe` and `wait`
// show of a lock held by a manual holder.
func TestKubectlShowsLocks(t *testing.T) {
	ns := newNamespace(t, "e2e-kubectl")
	dl := newLock(ns, "window", "window/db", "maintenance-by-alice")
	if err := cluster.Client.Create(t.Context(), dl); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "", "wait", "--for=condition=ManualHolderHeld", "dlock/window", "-n", ns, "--timeout=60s")
	held, err := getLock(t.Context(), ns, "window")
	if err != nil {
		t.Fatal(err)
	}
	if held.Status.FencingToken <= 0 || held.Status.Holder == nil || held.Status.Holder.Identity != "maintenance-by-alice" {
		t.Fatalf("status after Held: %+v", held.Status)
	}

	out := kubectl(t, "", "get", "dlock", "-n", ns)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get dlock:\n%s", out)
	}
	if got, want := strings.Fields(lines[0]), []string{"NAME", "KEYS", "HOLDER", "FENCE", "HELD", "SLOTS", "QUEUE", "EXPIRES", "AGE"}; !slices.Equal(got, want) {
		t.Errorf("kubectl get dlock columns = %v, want %v", got, want)
	}
	// The operator renews this lock's own lease, so EXPIRES is empty and the
	// row has one field fewer than the header.
	row := strings.Fields(lines[1])
	if len(row) != 8 || row[0] != "window" || row[1] != `["window/db"]` || row[2] != "maintenance-by-alice" ||
		row[3] != strconv.FormatInt(held.Status.FencingToken, 10) || row[4] != "Acquired" || row[5] != "1/1" || row[6] != "0" {
		t.Errorf("kubectl get dlock row = %q, want window, [\"window/db\"], maintenance-by-alice, %d, Acquired, 1/1, 0, (no expiry), <age>", row, held.Status.FencingToken)
	}
	wide := kubectl(t, "", "get", "dlocks", "-n", ns, "-o", "wide")
	if !strings.Contains(wide, "BACKEND") || !strings.Contains(wide, "Reachable") {
		t.Errorf("kubectl get dlocks -o wide lacks the BACKEND column:\n%s", wide)
	}

	// Events are written asynchronously: wait for the Acquired one.
	var desc string
	waitFor(t, 30*time.Second, "kubectl describe to show the Acquired event", func(context.Context) (bool, error) {
		desc = kubectl(t, "", "describe", "dlock", "window", "-n", ns)
		return regexp.MustCompile(`Normal\s+Acquired`).MatchString(desc), nil
	})
	for _, want := range []string{
		`Name:\s+window`, `Status:`, `Fencing Token:\s+` + strconv.FormatInt(held.Status.FencingToken, 10),
		`Holder:`, `Identity:\s+maintenance-by-alice`, `Conditions:`, `Type:\s+Held`, `Type:\s+BackendReady`,
		`Reason:\s+Acquired`, `Events:`,
	} {
		if !regexp.MustCompile(want).MatchString(desc) {
			t.Errorf("kubectl describe dlock lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("kubectl describe dlock window:\n%s", desc)
	}
}

// TestCronJobsShareALock runs two CronJobs on a one-minute schedule that
// share a lock, with the real CronJob and Job controllers and kwok. Over at
// least three schedule periods, with a kill -9 of the operator in the middle
// of a hold and a restart of Redis, their Pods never run at the same time,
// every run has a higher fencing token than the one before, and every Pod
// gets its token from its annotation. The lock uses the ClusterLockBackend
// dev-redis (the billing sample names dev, which here is the same master).
func TestCronJobsShareALock(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-cron")
	const key = "billing/ledger"
	dl := newBackendLock(ns, "billing", key, "")
	if err := cluster.Client.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the lock's BackendReady condition", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && conditionStatus(dl, locksv1alpha1.ConditionBackendReady) == metav1.ConditionTrue, err
	})
	rec := recordPods(t, ns)
	names := []string{"billing-report", "ledger-compaction"}
	for _, name := range names {
		if err := cluster.Client.Create(ctx, newCronJob(ns, name, "billing", 20*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubectl get cronjobs,jobs,pods,dlock:\n%s", kubectl(t, "", "get", "cronjobs,jobs,pods,dlock", "-n", ns, "-o", "wide"))
		}
		rec.check(t)
	})

	// The first run: the lock's holder is the running Pod's Job, with the Pod's token.
	var first run
	waitFor(t, 2*time.Minute, "the first Pod to run", func(context.Context) (bool, error) {
		runs := rec.snapshot()
		if len(runs) > 0 {
			first = runs[0]
		}
		return len(runs) > 0, nil
	})
	t.Logf("first run: pod %s of job %s with fencing token %d", first.pod, first.job, first.token)
	if !first.envFromAnnotation || first.token <= 0 || first.token != first.jobToken {
		t.Fatalf("first run: token %d (Job's %d), env from annotation %v", first.token, first.jobToken, first.envFromAnnotation)
	}
	waitFor(t, 10*time.Second, "the lock's status to show the running Job as holder", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		if err != nil || dl.Status.Holder == nil {
			return false, err
		}
		return dl.Status.Holder.Name == first.job && dl.Status.Holder.Kind == "Job" && dl.Status.FencingToken == first.token &&
			conditionStatus(dl, locksv1alpha1.ConditionHeld) == metav1.ConditionTrue, nil
	})

	t.Run("kill -9 of the operator during a hold", func(t *testing.T) {
		killOperatorDuringHold(t, ns, key, first)
	})

	// At least three schedule periods of both CronJobs.
	waitFor(t, 5*time.Minute, "runs of three schedule periods", func(context.Context) (bool, error) {
		periods := map[string]bool{}
		done := rec.finished()
		for _, ru := range done {
			periods[ru.schedule] = true
		}
		return len(done) >= 6 && len(periods) >= 3, nil
	})

	t.Run("restart of Redis", func(t *testing.T) {
		restartRedis(t, ns, names, rec)
	})
}

// killOperatorDuringHold kills the operator with SIGKILL while first's Pod
// runs and starts it again: the lease stays with the same owner and fencing
// token and the restarted operator renews it.
func killOperatorDuringHold(t *testing.T, ns, key string, first run) {
	ctx := t.Context()
	dl, err := getLock(ctx, ns, "billing")
	if err != nil {
		t.Fatal(err)
	}
	keys := backend.EngineKeys(dl)
	if len(keys) != 1 {
		t.Fatalf("engine keys of %s: %v", key, keys)
	}
	lockKey := backend.KeyPrefix + "{" + keys[0] + "}:lock"
	rc := redis.NewClient(&redis.Options{Addr: cluster.Redis[0].Addr})
	defer rc.Close()
	owner, err := rc.Get(ctx, lockKey).Result()
	if err != nil {
		t.Fatalf("read %s from Redis: %v", lockKey, err)
	}

	pid := cluster.OperatorPID()
	cluster.KillOperator()
	killedAt := time.Now()
	ttlAfterKill, err := rc.PTTL(ctx, lockKey).Result()
	if err != nil || ttlAfterKill <= 0 {
		t.Fatalf("PTTL %s after the kill: %v, %v", lockKey, ttlAfterKill, err)
	}
	t.Logf("killed the operator (pid %d) with SIGKILL; the lease has %v left", pid, ttlAfterKill)
	if err := cluster.StartOperator(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator restarted (pid %d) after %v", cluster.OperatorPID(), time.Since(killedAt).Round(time.Millisecond))

	// Only the restarted operator can extend the lease: once the TTL left
	// exceeds what it had after the kill minus the time passed, it renewed.
	waitFor(t, 20*time.Second, "the restarted operator to renew the lease", func(ctx context.Context) (bool, error) {
		pttl, err := rc.PTTL(ctx, lockKey).Result()
		if err != nil {
			return false, err
		}
		return pttl > ttlAfterKill-time.Since(killedAt)+2*time.Second, nil
	})
	if now, err := rc.Get(ctx, lockKey).Result(); err != nil || now != owner {
		t.Fatalf("the lease's owner changed across the restart (%v): the hold did not continue", err)
	}
	var job batchv1.Job
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: first.job}, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Annotations[locksv1alpha1.AnnotationFencingToken]; got != strconv.FormatInt(first.token, 10) {
		t.Fatalf("the Job's fencing token changed across the restart: %s, was %d", got, first.token)
	}
	if finished(&job) {
		t.Fatalf("Job %s finished before the restarted operator renewed its lease; the test did not kill during a hold", first.job)
	}
	waitFor(t, 20*time.Second, "the lock's status to show the same holder and token", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		if err != nil || dl.Status.Holder == nil {
			return false, err
		}
		return dl.Status.Holder.Name == first.job && dl.Status.FencingToken == first.token &&
			conditionStatus(dl, locksv1alpha1.ConditionHeld) == metav1.ConditionTrue, nil
	})
	t.Logf("the restarted operator renewed %s's lease with the same owner and fencing token %d", first.job, first.token)
}

// restartRedis stops the CronJobs, restarts Redis (empty) while no Job holds
// the lock, and checks that the lock reports it and recovers by itself, and
// that the next run gets a higher fencing token than every run before.
func restartRedis(t *testing.T, ns string, names []string, rec *podRecorder) {
	ctx := t.Context()
	setSuspend(t, ns, names, true)
	waitFor(t, 2*time.Minute, "every Job to finish and the lock to be free", func(ctx context.Context) (bool, error) {
		var jobs batchv1.JobList
		if err := cluster.Client.List(ctx, &jobs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range jobs.Items {
			if !finished(&jobs.Items[i]) {
				return false, nil
			}
		}
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && dl.Status.Holder == nil && conditionStatus(dl, locksv1alpha1.ConditionHeld) == metav1.ConditionFalse, err
	})
	runs := rec.finished()
	before := len(runs)
	maxToken := runs[len(runs)-1].token

	cluster.KillRedis(0)
	t.Logf("killed Redis at %s", cluster.Redis[0].Addr)
	waitFor(t, 30*time.Second, "BackendReady=False", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && conditionStatus(dl, locksv1alpha1.ConditionBackendReady) == metav1.ConditionFalse, err
	})
	t.Logf("kubectl get dlock -o wide while Redis is down:\n%s", kubectl(t, "", "get", "dlock", "-n", ns, "-o", "wide"))
	if err := cluster.StartRedis(ctx, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "BackendReady=True after Redis is back", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "billing")
		return err == nil && conditionStatus(dl, locksv1alpha1.ConditionBackendReady) == metav1.ConditionTrue, err
	})
	t.Logf("Redis restarted empty; the lock's backend is ready again")

	setSuspend(t, ns, names, false)
	waitFor(t, 3*time.Minute, "two more runs after the restart", func(context.Context) (bool, error) {
		return len(rec.finished()) >= before+2, nil
	})
	after := rec.finished()[before]
	if after.token <= maxToken {
		t.Errorf("the first run after Redis restarted empty has fencing token %d, not above the last one before, %d", after.token, maxToken)
	}
	t.Logf("runs continue after the restart: pod %s with fencing token %d (last before: %d)", after.pod, after.token, maxToken)
}

func setSuspend(t *testing.T, ns string, names []string, suspend bool) {
	t.Helper()
	for _, name := range names {
		var cj batchv1.CronJob
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &cj); err != nil {
			t.Fatal(err)
		}
		before := cj.DeepCopy()
		cj.Spec.Suspend = ptr.To(suspend)
		if err := cluster.Client.Patch(t.Context(), &cj, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
}

func finished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
