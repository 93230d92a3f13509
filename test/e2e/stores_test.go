//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// TestQuickstartOnOtherStores runs the README's quickstart on PostgreSQL and
// on ZooKeeper: in the shared cluster it starts the store as `make dev
// BACKEND=...` does (devcluster's StartStore) and creates its
// ClusterLockBackend through the same code as make dev's dev (ApplyBackend),
// named dev-<store>. Then, with the pinned kubectl: it applies the sample
// lock (config/samples, its clusterBackendRef pointed at that backend), gives
// it a manual holder, waits for Held, reads holder and fencing token from
// `kubectl get dlock`, applies the sample Job gated by the lock, which waits
// while the manual holder holds, releases the holder, and sees the Job run
// with a larger fencing token.
func TestQuickstartOnOtherStores(t *testing.T) {
	// The sample backends for the other stores are valid for the API server too.
	for _, f := range []string{"postgres.yaml", "zookeeper.yaml", "etcd.yaml"} {
		out := kubectl(t, "", "apply", "--dry-run=server", "-f", filepath.Join(cluster.Root, "config", "samples", "backends", f))
		t.Logf("config/samples/backends/%s: %s", f, strings.TrimSpace(out))
	}
	for _, kind := range []string{devcluster.StorePostgres, devcluster.StoreZooKeeper} {
		t.Run(kind, func(t *testing.T) { quickstartOn(t, kind) })
	}
}

func quickstartOn(t *testing.T, kind string) {
	requireStore(t, kind)
	ctx := t.Context()
	begin := time.Now()
	store, err := cluster.StartStore(ctx, kind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Stop)
	t.Logf("%s ready in %s at %s; log %s", kind, time.Since(begin).Round(100*time.Millisecond), strings.Join(store.Addrs, ","), strings.Join(store.LogPaths, ", "))
	backend := "dev-" + kind
	if err := cluster.ApplyBackend(ctx, backend, store); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.Client.Delete(ctx, &locksv1alpha1.ClusterLockBackend{ObjectMeta: metav1.ObjectMeta{Name: backend}})
		_ = cluster.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: devcluster.OperatorNamespace, Name: devcluster.PasswordSecretName(backend)}})
	})
	ns := newNamespace(t, "e2e-quickstart-"+kind)

	// The sample lock, on this store's backend instead of dev.
	data, err := os.ReadFile(filepath.Join(cluster.Root, "config", "samples", "locks_v1alpha1_distributedlock.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ref := "    clusterBackendRef:\n      name: " + devcluster.DevBackend + "\n"
	if strings.Count(string(data), ref) != 1 {
		t.Fatalf("the sample lock does not name the ClusterLockBackend %s as %q:\n%s", devcluster.DevBackend, ref, data)
	}
	sample := strings.Replace(string(data), ref, "    clusterBackendRef:\n      name: "+backend+"\n", 1)
	kubectl(t, sample, "apply", "-n", ns, "-f", "-")
	const holder = "maintenance-by-alice"
	kubectl(t, "", "patch", "dlock", "billing", "-n", ns, "--type=merge", "-p", `{"spec":{"holder":{"identity":"`+holder+`"}}}`)
	kubectl(t, "", "wait", "--for=condition=ManualHolderHeld", "dlock/billing", "-n", ns, "--timeout=90s")

	out := kubectl(t, "", "get", "dlock", "billing", "-n", ns)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get dlock billing:\n%s", out)
	}
	// NAME KEYS HOLDER FENCE HELD SLOTS QUEUE (EXPIRES, empty: the operator renews a manual holder's lease) AGE
	row := strings.Fields(lines[1])
	if len(row) < 5 || row[0] != "billing" || row[2] != holder || row[4] != "Acquired" {
		t.Fatalf("kubectl get dlock billing row = %q, want billing, keys, %s, <token>, Acquired, ...\n%s", row, holder, out)
	}
	manualToken, err := strconv.ParseInt(row[3], 10, 64)
	if err != nil || manualToken <= 0 {
		t.Fatalf("kubectl get dlock billing shows fencing token %q, want a positive number:\n%s", row[3], out)
	}
	t.Logf("kubectl get dlock billing (%s):\n%s", kind, out)
	wide := kubectl(t, "", "get", "dlock", "billing", "-n", ns, "-o", "wide")
	if !strings.Contains(wide, "BACKEND") {
		t.Errorf("kubectl get dlock -o wide lacks the BACKEND column:\n%s", wide)
	}

	// The sample Job gated by the lock waits while the manual holder holds.
	kubectl(t, "", "apply", "-n", ns, "-f", filepath.Join(cluster.Root, "config", "samples", "batch_v1_job_fenced.yaml"))
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fenced-write"}}
	waitFor(t, 30*time.Second, "the Job to be gated and to wait in the lock's queue", func(ctx context.Context) (bool, error) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		dl, err := getLock(ctx, ns, "billing")
		if err != nil {
			return false, err
		}
		return gated(job) && waits(dl, job.Name), nil
	})
	// A few resync periods: it keeps waiting.
	time.Sleep(4 * time.Second)
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := cluster.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(job.Spec.Suspend, false) || len(pods.Items) > 0 {
		t.Fatalf("while %s holds the lock the Job runs: suspend %v, %d Pods", holder, job.Spec.Suspend, len(pods.Items))
	}

	// Released, the Job acquires the lock, runs, and completes.
	kubectl(t, "", "patch", "dlock", "billing", "-n", ns, "--type=json", "-p", `[{"op":"remove","path":"/spec/holder"}]`)
	waitFor(t, 90*time.Second, "the Job to run once the manual holder released the lock, and to complete", func(ctx context.Context) (bool, error) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		return finished(job), nil
	})
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			t.Fatalf("the Job failed: %s: %s", c.Reason, c.Message)
		}
	}
	jobToken, err := strconv.ParseInt(job.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	if err != nil || jobToken <= manualToken {
		t.Fatalf("the Job ran with fencing token %q, want a number above the manual holder's %d", job.Annotations[locksv1alpha1.AnnotationFencingToken], manualToken)
	}
	t.Logf("%s: the manual holder had fencing token %d, the Job %d", kind, manualToken, jobToken)

	// As the quickstart ends: delete them, while the store still runs, so the
	// operator releases what it holds there.
	kubectl(t, "", "delete", "-n", ns, "job/fenced-write", "dlock/billing", "--timeout=60s")
}

// requireStore skips the test when the store's servers are not installed,
// or fails it when LOCKWARDEN_REQUIRE_SERVERS is set.
func requireStore(t *testing.T, kind string) {
	t.Helper()
	var err error
	switch kind {
	case devcluster.StorePostgres:
		_, err = pgtest.BinDir()
	case devcluster.StoreZooKeeper:
		_, _, err = zktest.Runtime()
	}
	if err == nil {
		return
	}
	if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
		t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but %s is missing: %v", kind, err)
	}
	t.Skipf("%s missing: %v", kind, err)
}
