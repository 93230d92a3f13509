package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/cli"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// The kubeconfig the tests write has two contexts on the same API server:
// contextA (the current one) defaults to namespaceA, contextB to namespaceB.
const (
	contextA   = "team-a"
	contextB   = "team-b"
	namespaceA = "team-a"
	namespaceB = "team-b"
)

var (
	// env is the control plane; nil under -short.
	env *kubetest.Env
	// kubeconfig is the path of the kubeconfig file every command is given.
	kubeconfig string
)

func TestMain(m *testing.M) {
	kubetest.MainEnv(m, "kubectl-lockwarden", func(e *kubetest.Env) (func(), error) {
		env = e
		dir, err := os.MkdirTemp("", "kubectl-lockwarden-")
		if err != nil {
			return nil, err
		}
		cleanup := func() { _ = os.RemoveAll(dir) }
		kubeconfig = filepath.Join(dir, "config")
		return cleanup, setUp(kubeconfig)
	})
}

// setUp writes the kubeconfig file and creates both contexts' namespaces.
func setUp(path string) error {
	cfg := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts[contextA] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: namespaceA}
	kc.Contexts[contextB] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: namespaceB}
	kc.CurrentContext = contextA
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, ns := range []string{namespaceA, namespaceB} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	return nil
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}

// result is what a user sees of one command.
type result struct {
	out, errOut string
	err         error
}

// run runs kubectl-lockwarden in-process with the test's kubeconfig, as a
// user would type it, and logs what it printed.
func run(ctx context.Context, t testing.TB, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	streams := genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}
	err := cli.Execute(ctx, streams, append([]string{"--kubeconfig=" + kubeconfig}, args...))
	t.Logf("$ kubectl lockwarden %s\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
	return result{out: out.String(), errOut: errOut.String(), err: err}
}

// mustRun is run for a command that must succeed.
func mustRun(ctx context.Context, t testing.TB, args ...string) string {
	t.Helper()
	r := run(ctx, t, args...)
	if r.err != nil {
		t.Fatalf("kubectl lockwarden %s: %v", strings.Join(args, " "), r.err)
	}
	return r.out
}

// wantError fails the test unless the command fails with an error that
// contains every one of parts.
func wantError(t testing.TB, r result, parts ...string) {
	t.Helper()
	if r.err == nil {
		t.Fatalf("the command succeeded, want an error; it printed:\n%s", r.out)
	}
	for _, p := range parts {
		if !strings.Contains(r.err.Error(), p) {
			t.Errorf("error %q does not say %q", r.err, p)
		}
	}
	if !strings.Contains(r.errOut, "error: "+r.err.Error()) {
		t.Errorf("stderr %q does not show the error", r.errOut)
	}
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(ctx context.Context, t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cli-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// lockBuilder builds a DistributedLock for a test.
type lockBuilder struct{ dl locksv1alpha1.DistributedLock }

func makeLock(name, ns string) *lockBuilder {
	return &lockBuilder{dl: locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{name + "/main"},
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6379"}}},
		},
	}}
}

func (b *lockBuilder) clusterBackend(name string) *lockBuilder {
	b.dl.Spec.Backend = locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: name}}
	return b
}

func (b *lockBuilder) create(ctx context.Context, t testing.TB) *locksv1alpha1.DistributedLock {
	t.Helper()
	dl := b.dl.DeepCopy()
	if err := env.Client.Create(ctx, dl); err != nil {
		t.Fatalf("create lock %s: %v", dl.Name, err)
	}
	return dl
}

// setStatus writes a lock's status as the operator would: change edits the
// freshly read status.
func setStatus(ctx context.Context, t testing.TB, ns, name string, change func(*locksv1alpha1.DistributedLock)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var dl locksv1alpha1.DistributedLock
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dl); err != nil {
			return err
		}
		change(&dl)
		dl.Status.ObservedGeneration = dl.Generation
		return env.Client.Status().Update(ctx, &dl)
	})
	if err != nil {
		t.Fatalf("write the status of lock %s: %v", name, err)
	}
}

// held fills a status in which identity holds the lock with token.
func held(dl *locksv1alpha1.DistributedLock, identity string, token int64, since time.Time) {
	at := metav1.NewTime(since)
	dl.Status.Holder = &locksv1alpha1.HolderStatus{Identity: identity, Lock: dl.Name, Namespace: dl.Namespace, Kind: "Job"}
	dl.Status.Holders = []locksv1alpha1.HolderStatus{{Identity: identity, Lock: dl.Name, Namespace: dl.Namespace, Kind: "Job", FencingToken: token, AcquiredTime: &at}}
	dl.Status.HolderCount = ptr.To[int32](1)
	dl.Status.Slots = "1/1"
	dl.Status.FencingToken = token
	dl.Status.AcquiredTime = &at
	setCondition(dl, locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired, "a holder of this lock holds the keys")
	setCondition(dl, locksv1alpha1.ConditionBackendReady, metav1.ConditionTrue, locksv1alpha1.ReasonBackendReachable, "redis.infra:6379 answered")
}

func setCondition(dl *locksv1alpha1.DistributedLock, t string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&dl.Status.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: dl.Generation})
}

// jobIdentity is the holder identity the operator gives a Job.
func jobIdentity(job *batchv1.Job) string {
	return fmt.Sprintf("default/%s/Job/%s/%s", job.Namespace, job.Name, string(job.UID)[:5])
}

// createJob creates a gated Job of lock as the webhook admits it
// (suspended, labelled) with the given annotations besides the lock's.
func createJob(ctx context.Context, t testing.TB, ns, name, lock string, suspended bool, annotations map[string]string) *batchv1.Job {
	t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}, Labels: map[string]string{}},
		Spec: batchv1.JobSpec{
			Suspend: ptr.To(suspended),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
			}},
		},
	}
	if lock != "" {
		job.Annotations[locksv1alpha1.AnnotationLock] = lock
		job.Labels[locksv1alpha1.LabelLock] = lock
	}
	for k, v := range annotations {
		job.Annotations[k] = v
	}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	return job
}

// annotateJob sets annotations on a Job as the operator would.
func annotateJob(ctx context.Context, t testing.TB, job *batchv1.Job, annotations map[string]string) {
	t.Helper()
	before := job.DeepCopy()
	for k, v := range annotations {
		job.Annotations[k] = v
	}
	if err := env.Client.Patch(ctx, job, client.MergeFrom(before)); err != nil {
		t.Fatalf("annotate Job %s: %v", job.Name, err)
	}
}

// getLock reads a lock back from the server.
func getLock(ctx context.Context, t testing.TB, ns, name string) *locksv1alpha1.DistributedLock {
	t.Helper()
	var dl locksv1alpha1.DistributedLock
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dl); err != nil {
		t.Fatal(err)
	}
	return &dl
}

// rows splits a table into its rows of whitespace-separated cells,
// header first.
func rows(table string) [][]string {
	var out [][]string
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// testContext returns a context that ends with the test, bounded so that a
// hung command fails the test instead of the whole run.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
