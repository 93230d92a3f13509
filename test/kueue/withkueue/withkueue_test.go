// Package withkueue runs lockwarden's admission check with Kueue's own
// manager (sigs.k8s.io/kueue/cmd/kueue v0.17.0, built by hack/kueue.sh),
// lockwarden's manager and a redis-server against one envtest control plane
// serving Kueue's CRDs: Kueue creates the Workloads of queued Jobs,
// reserves quota, asks lockwarden's check and starts the Jobs.
//
// envtest runs no kube-controller-manager: the test ends a Job as its Job
// controller would (its status), and no pods run.
package withkueue

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

const ns = "default"

// kueueBinary is Kueue's manager from $LOCKWARDEN_KUEUE or hack/kueue.sh's
// cache; the test skips without it (and fails under LOCKWARDEN_REQUIRE_SERVERS).
func kueueBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LOCKWARDEN_KUEUE"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err == nil {
		p := filepath.Join(cache, "lockwarden", "kueue", "v0.17.0-"+goruntime.GOOS+"-"+goruntime.GOARCH, "kueue")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
		t.Fatal("Kueue's manager is missing: build it with hack/kueue.sh (or set LOCKWARDEN_KUEUE)")
	}
	t.Skip("Kueue's manager is missing: build it with hack/kueue.sh (or set LOCKWARDEN_KUEUE)")
	return ""
}

// conversionCRDs are the CRDs whose conversion webhook Kueue's certificate
// rotator injects its CA into: it waits for them at start.
var conversionCRDs = []string{"localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters"}

// installKueueCRDs installs Kueue's CRDs (../crds) with the conversion
// webhook its manager serves at webhookPort, as Kueue's own installation
// does (with a URL instead of its Service). (envtest's own CRD installation
// drops the conversion webhooks of types its scheme cannot convert.)
func installKueueCRDs(t *testing.T, env *kubetest.Env, c client.Client, webhookPort int) {
	dir := t.TempDir()
	root, err := kubetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "test", "kueue", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("Kueue's CRDs: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, plural := range conversionCRDs {
			if filepath.Base(f) != "kueue.x-k8s.io_"+plural+".yaml" {
				continue
			}
			var crd map[string]any
			if err := yaml.Unmarshal(b, &crd); err != nil {
				t.Fatal(err)
			}
			crd["spec"].(map[string]any)["conversion"] = map[string]any{
				"strategy": "Webhook",
				"webhook": map[string]any{
					"conversionReviewVersions": []any{"v1"},
					"clientConfig":             map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d/convert", webhookPort)},
				},
			}
			if b, err = yaml.Marshal(crd); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files, err = filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadManifests(files...)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(context.Background(), objs...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Kueue's CRDs to be served", func() (bool, string) {
		for _, l := range []client.ObjectList{&kueue.WorkloadList{}, &kueue.ClusterQueueList{}, &kueue.LocalQueueList{}, &kueue.AdmissionCheckList{}, &kueue.ResourceFlavorList{}} {
			if err := c.List(context.Background(), l); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
}

// writeKubeconfig writes a kubeconfig for cfg (client certificate).
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["kueue"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "kueue"}
	kc.CurrentContext = "envtest"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// startKueue runs Kueue's manager with its webhook server on webhookPort,
// its own certificates (internal certificate management), only the
// batch/job integration, and no visibility server; it returns once Kueue
// is ready, and stops it when the test ends.
func startKueue(t *testing.T, env *kubetest.Env, c client.Client, webhookPort int) {
	t.Helper()
	bin := kueueBinary(t)
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}},
		// The rotator fills the Secret Kueue's installation creates empty.
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kueue-webhook-server-cert", Namespace: "kueue-system"}},
		// The rotator injects its CA into these; Kueue's webhooks are not
		// called here (the test creates Jobs as Kueue's webhook leaves them).
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-mutating-webhook-configuration"}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating-webhook-configuration"}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	probePort, err := freeport.Take()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: kueue-webhook-service
  webhookSecretName: kueue-webhook-server-cert
integrations:
  frameworks: ["batch/job"]
`, probePort, webhookPort, filepath.Join(dir, "certs"))
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	userCfg, err := env.AddUser("system:serviceaccount:kueue-system:kueue-controller-manager", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	mountSecret(t, c, filepath.Join(dir, "certs"))
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--config", cfgFile, "--kubeconfig", writeKubeconfig(t, userCfg),
		"--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("Kueue's log: %s", saveLog(t, logs.Bytes()))
		}
	})
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if cmd.ProcessState != nil {
			return false, fmt.Errorf("kueue exited: %v", cmd.ProcessState)
		}
		out, err := exec.CommandContext(ctx, "curl", "-sf", fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)).CombinedOutput()
		return err == nil && strings.Contains(string(out), "ok"), nil
	})
	if err != nil {
		t.Fatalf("Kueue's manager did not become ready: %v", err)
	}
}

// mountSecret writes the certificate Kueue's rotator stores in its Secret
// into certDir, where Kueue's webhook server reads it, as the kubelet
// mounts the Secret into Kueue's pod; the rotator waits for that.
func mountSecret(t *testing.T, c client.Client, certDir string) {
	t.Helper()
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			var s corev1.Secret
			if err := c.Get(ctx, client.ObjectKey{Namespace: "kueue-system", Name: "kueue-webhook-server-cert"}, &s); err != nil || len(s.Data["tls.crt"]) == 0 {
				return false, nil
			}
			for _, k := range []string{"tls.key", "ca.crt", "tls.crt"} { // tls.crt last: the rotator looks for it
				if err := os.WriteFile(filepath.Join(certDir, k), s.Data[k], 0o600); err != nil {
					return false, err
				}
			}
			return true, nil
		})
	}()
}

// installJobGatePolicy applies lockwarden's job-gate admission policy
// (config/policy), which Kueue's writes must pass (the lock billing must
// exist, for lockwarden's webhook): Kueue runs as the user
// the policy names as Kueue's controller. It returns once the API server
// enforces it.
func installJobGatePolicy(t *testing.T, env *kubetest.Env, c client.Client) {
	t.Helper()
	objs, err := kubetest.ReadManifests("config/policy/job_gate_policy.yaml", "config/policy/job_gate_binding.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(context.Background(), objs...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job-gate policy to refuse a queued Job that names a lock created unsuspended", func() (bool, string) {
		j := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns,
				Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "none"},
				Annotations: map[string]string{locksv1alpha1.AnnotationLock: "billing"}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
		}
		err := c.Create(context.Background(), j, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), fmt.Sprint(err)
	})
}

// saveLog keeps Kueue's log of a failed test where it can be read after
// the test's temporary directories are gone, and returns its path.
func saveLog(t *testing.T, b []byte) string {
	f, err := os.CreateTemp("", "kueue-*.log")
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Write(b); err != nil {
		return err.Error()
	}
	return f.Name()
}

// waitFor polls cond every 100ms for up to a minute, and says what it last saw.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	last := ""
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) {
			ok, seen := cond()
			last = seen
			return ok, nil
		})
	if err != nil {
		t.Fatalf("timed out waiting for %s; last seen: %s", what, last)
	}
}

// TestKueueStartsJobsOneAtATime: with Kueue's real manager, a ClusterQueue
// whose AdmissionCheck is lockwarden's starts two Jobs that name one lock
// one after the other, though it has quota for both: each starts with its
// fencing token in its pod template, the second only once the first
// finished; a Job whose Workload is deactivated (evicted) gives the lock
// back once Kueue stopped it.
func TestKueueStartsJobsOneAtATime(t *testing.T) {
	webhookPort, err := freeport.Take()
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(t, kubetest.WithWebhooks())
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(locksv1alpha1.AddToScheme(scheme))
	utilruntime.Must(kueue.AddToScheme(scheme))
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	installKueueCRDs(t, env, c, webhookPort)
	startKueue(t, env, c, webhookPort)
	rdb := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	if err := managertest.Start(ctx, env, env.Config, []string{
		"--leader-election-namespace=" + ns,
		"--endpoint-allow=127.0.0.1/32",
		"--default-cluster-lock-backend=",
		"--kueue-admission-check=true",
	}, stopped); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("lockwarden's manager stopped with %v", err)
		}
	})

	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	create(&locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"billing/ledger"}, TTLSeconds: 10,
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}}},
	})
	installJobGatePolicy(t, env, c)
	create(&kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: "lockwarden"}, Spec: kueue.AdmissionCheckSpec{ControllerName: "lockwarden.io/lock"}})
	create(&kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	create(&kueue.ClusterQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "batch"},
		Spec: kueue.ClusterQueueSpec{
			NamespaceSelector: &metav1.LabelSelector{},
			ResourceGroups: []kueue.ResourceGroup{{CoveredResources: []corev1.ResourceName{corev1.ResourceCPU}, Flavors: []kueue.FlavorQuotas{{
				Name: "default", Resources: []kueue.ResourceQuota{{Name: corev1.ResourceCPU, NominalQuota: resource.MustParse("4")}},
			}}}},
			AdmissionChecksStrategy: &kueue.AdmissionChecksStrategy{AdmissionChecks: []kueue.AdmissionCheckStrategyRule{{Name: "lockwarden"}}},
		},
	})
	create(&kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Namespace: ns}, Spec: kueue.LocalQueueSpec{ClusterQueue: "batch"}})

	job := func(name string) *batchv1.Job {
		j := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "team-a"},
				Annotations: map[string]string{locksv1alpha1.AnnotationLock: "billing"}},
			Spec: batchv1.JobSpec{Suspend: new(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "work", Image: "busybox",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			}}},
		}
		create(j)
		return j
	}
	// started tells whether Kueue started the Job, and with what token.
	started := func(name string) (bool, int64, string) {
		var j batchv1.Job
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
			return false, 0, err.Error()
		}
		f, _ := strconv.ParseInt(j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
		running := j.Spec.Suspend != nil && !*j.Spec.Suspend
		return running, f, fmt.Sprintf("suspend=%v template annotations=%v", *j.Spec.Suspend, j.Spec.Template.Annotations)
	}
	workloadOf := func(name string) *kueue.Workload {
		var list kueue.WorkloadList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil
		}
		for i := range list.Items {
			for _, o := range list.Items[i].OwnerReferences {
				if o.Kind == "Job" && o.Name == name {
					return &list.Items[i]
				}
			}
		}
		return nil
	}
	checkOf := func(name string) string {
		wl := workloadOf(name)
		if wl == nil {
			return "no Workload"
		}
		for _, s := range wl.Status.AdmissionChecks {
			return fmt.Sprintf("%s %q", s.State, s.Message)
		}
		return fmt.Sprintf("no check; conditions %v", wl.Status.Conditions)
	}

	job("first")
	var firstToken int64
	waitFor(t, "Kueue to start the first Job with lockwarden's fencing token", func() (bool, string) {
		running, f, seen := started("first")
		firstToken = f
		return running && f > 0, seen + "; check " + checkOf("first")
	})
	job("second")
	waitFor(t, "the second Job's check to wait for the lock", func() (bool, string) {
		s := checkOf("second")
		return strings.Contains(s, "Pending") && strings.Contains(s, "Waiting for lock billing") && strings.Contains(s, "/Workload/job-first-"), s
	})
	if running, _, seen := started("second"); running {
		t.Fatalf("Kueue started the second Job while the first holds the lock: %s", seen)
	}

	// The first Job succeeds (as kube-controller-manager's Job controller
	// would mark it): Kueue finishes its Workload, lockwarden releases, and
	// Kueue starts the second with a larger token.
	var first batchv1.Job
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "first"}, &first); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	first.Status.StartTime = &now
	first.Status.CompletionTime = &now
	first.Status.Succeeded = 1
	first.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	if err := c.Status().Update(ctx, &first); err != nil {
		t.Fatalf("mark the first Job complete: %v", err)
	}
	var secondToken int64
	waitFor(t, "Kueue to start the second Job with a larger token once the first finished", func() (bool, string) {
		running, f, seen := started("second")
		secondToken = f
		return running && f > firstToken, seen + "; check " + checkOf("second")
	})

	// A third waits; the second's Workload is deactivated: Kueue evicts it,
	// stops the Job and gives back the quota, and the third starts.
	job("third")
	waitFor(t, "the third Job's check to wait for the lock", func() (bool, string) {
		s := checkOf("third")
		return strings.Contains(s, "Waiting for lock billing"), s
	})
	wl := workloadOf("second")
	if wl == nil {
		t.Fatal("the second Job has no Workload")
	}
	wl.Spec.Active = new(false)
	if err := c.Update(ctx, wl); err != nil {
		t.Fatalf("deactivate the second Workload: %v", err)
	}
	waitFor(t, "Kueue to stop the second Job and start the third with a larger token", func() (bool, string) {
		running2, _, seen2 := started("second")
		running3, f, seen3 := started("third")
		return !running2 && running3 && f > secondToken, "second: " + seen2 + "; third: " + seen3 + "; check " + checkOf("third")
	})
	if wl := workloadOf("second"); wl == nil || apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
		t.Errorf("the deactivated Workload still holds quota")
	}
}
