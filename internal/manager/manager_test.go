package manager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestManagerAgainstRealAPIServer starts the manager as main does, against a
// real kube-apiserver and a real redis-server, and checks what an operator
// would look at after installing it.
func TestManagerAgainstRealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.WithWebhooks())
	rdb := redistest.Start(t)

	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.Major != "1" || v.Minor != "37" || !strings.HasPrefix(v.GitVersion, "v1.37.") {
		t.Fatalf("kube-apiserver reports %s (major %q minor %q), want v1.37.x", v.GitVersion, v.Major, v.Minor)
	}

	metricsPort, probePort := runManager(t, env,
		"--leader-elect",
		"--leader-election-namespace", "default",
		// The test's Redis is on loopback, which inline endpoints may not
		// reach by default.
		"--endpoint-allow=127.0.0.1/32")
	ctx := context.Background()

	waitFor(t, "/readyz to answer 200", func() bool { return httpStatus(fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)) == http.StatusOK })
	if got := httpStatus(fmt.Sprintf("http://127.0.0.1:%d/healthz", probePort)); got != http.StatusOK {
		t.Fatalf("/healthz answered %d, want 200", got)
	}

	// The manager became leader: the election Lease names it.
	waitFor(t, "the leader election Lease to have a holder", func() bool {
		var lease coordinationv1.Lease
		err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: leaderElectionID}, &lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})

	// A DistributedLock can be created and read back, and the controller
	// finds the redis-server this test started.
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{"billing/ledger"},
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	}
	if err := env.Client.Create(ctx, dl); err != nil {
		t.Fatalf("create DistributedLock: %v", err)
	}
	var got locksv1alpha1.DistributedLock
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "billing"}, &got); err != nil {
		t.Fatalf("read DistributedLock back: %v", err)
	}
	if got.Spec.TTLSeconds != 30 || got.Spec.Scope != locksv1alpha1.ScopeNamespace || got.Spec.Contention != locksv1alpha1.ContentionQueue {
		t.Fatalf("defaults not applied: ttlSeconds=%d scope=%q contention=%q", got.Spec.TTLSeconds, got.Spec.Scope, got.Spec.Contention)
	}
	waitFor(t, "BackendReady=True", func() bool {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "billing"}, &got); err != nil {
			return false
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, locksv1alpha1.ConditionBackendReady)
	})

	// A Job that names the lock is gated by the webhook and started by the
	// Job controller with a fencing token.
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "default", Annotations: map[string]string{"lockwarden.io/lock": "billing"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatalf("create Job: %v", err)
	}
	waitFor(t, "the Job to run with a fencing token", func() bool {
		var j batchv1.Job
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "nightly"}, &j); err != nil {
			return false
		}
		return j.Spec.Suspend != nil && !*j.Spec.Suspend && j.Spec.Template.Annotations["lockwarden.io/fencing-token"] != ""
	})

	// The reconciles and the acquisition show up on the metrics endpoint.
	body := httpBody(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	for _, want := range []string{
		`controller_runtime_reconcile_total{controller="distributedlock",result="success"}`,
		`lockwarden_acquisitions_total{kind="Job",result="acquired"} 1`,
		`lockwarden_leases_held 1`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %s; got:\n%.3000s", want, body)
		}
	}

	// Killing Redis turns the condition False with a reason a user can act on.
	rdb.Kill()
	waitFor(t, "BackendReady=False after Redis was killed", func() bool {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "billing"}, &got); err != nil {
			return false
		}
		c := meta.FindStatusCondition(got.Status.Conditions, locksv1alpha1.ConditionBackendReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == locksv1alpha1.ReasonBackendUnreachable
	})
}

func TestKubeconfigFlagIsUsed(t *testing.T) {
	o, err := ParseFlags([]string{"--kubeconfig", "/nonexistent/kubeconfig"})
	if err != nil {
		t.Fatalf("--kubeconfig rejected: %v", err)
	}
	if _, err := RestConfig(o.kubeconfig); err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Fatalf("restConfig = %v, want an error naming the kubeconfig given", err)
	}
}

// TestKubeAPIRateLimit: the manager talks to the API server at
// --kube-api-qps and --kube-api-burst (by default well above client-go's 5
// per second, which a kubeconfig file gives), whatever the configuration
// it was loaded from said.
func TestKubeAPIRateLimit(t *testing.T) {
	o, err := ParseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	loaded := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 5, Burst: 10}
	cfg := withRateLimit(loaded, o)
	if cfg.QPS != DefaultKubeAPIQPS || cfg.Burst != DefaultKubeAPIBurst {
		t.Fatalf("default rate limit %v/s, burst %d; want %v/s, burst %d", cfg.QPS, cfg.Burst, DefaultKubeAPIQPS, DefaultKubeAPIBurst)
	}
	if loaded.QPS != 5 {
		t.Fatal("the loaded configuration was changed")
	}
	o, err = ParseFlags([]string{"--kube-api-qps=-1", "--kube-api-burst=0"})
	if err != nil {
		t.Fatalf("an unlimited client was refused: %v", err)
	}
	if cfg := withRateLimit(loaded, o); cfg.QPS >= 0 {
		t.Fatalf("--kube-api-qps=-1 gave %v/s, want no client-side limit (negative)", cfg.QPS)
	}
	for _, args := range [][]string{{"--kube-api-qps=0"}, {"--kube-api-burst=0"}, {"--namespace-reconcile-qps=0"}} {
		if _, err := ParseFlags(args); err == nil || !strings.Contains(err.Error(), strings.SplitN(args[0], "=", 2)[0]) {
			t.Errorf("ParseFlags(%q) = %v, want an error naming the flag", args, err)
		}
	}
}

func TestParseFlagsRejectsBadElectionTimings(t *testing.T) {
	_, err := ParseFlags([]string{"--leader-election-lease-duration=5s", "--leader-election-renew-deadline=10s"})
	if err == nil || !strings.Contains(err.Error(), "--leader-election-renew-deadline") {
		t.Fatalf("parseFlags = %v, want an error naming --leader-election-renew-deadline", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--endpoint-allow=10.0.0.0/33"}, "10.0.0.0/33"},
		{[]string{"--endpoint-deny=redis.example.com"}, "redis.example.com"},
		{[]string{"--max-concurrent-reconciles=0"}, "--max-concurrent-reconciles"},
		{[]string{"--cluster-name=prod|eu"}, "--cluster-name"},
		{[]string{"--cluster-name=prod/eu"}, "--cluster-name"},
		{[]string{"--cluster-name=Prod"}, "--cluster-name"},
		{[]string{"--endpoint-deny-refresh=500ms"}, "--endpoint-deny-refresh"},
	} {
		if _, err := ParseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFlags(%q) = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	if _, err := ParseFlags([]string{"stray"}); err == nil || !strings.Contains(err.Error(), "stray") {
		t.Fatalf("ParseFlags(stray) = %v, want an error naming the stray argument", err)
	}
}

// runManager runs the manager as main does against env (started with
// kubetest.WithWebhooks), with args after the flags of the webhook, metrics
// (plain HTTP) and probe servers, until the test ends; it returns the
// metrics and probe ports.
func runManager(t *testing.T, env *kubetest.Env, args ...string) (metricsPort, probePort int) {
	t.Helper()
	metricsPort, probePort = freePort(t), freePort(t)
	_, webhookPort, certDir := env.Webhook()
	o, err := ParseFlags(append([]string{
		"--webhook-cert-mode=external",
		"--webhook-cert-dir", certDir,
		"--webhook-port", fmt.Sprint(webhookPort),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"--metrics-secure=false",
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probePort),
	}, args...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, env.Config, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager stopped with %v", err)
		}
	})
	return metricsPort, probePort
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func httpBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond until it holds, failing the test after 30 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// The API server's and the pod's own addresses are lifted from the deny list
// only by an allow entry that names them, never by a wider CIDR.
func TestDerivedAddressesNeedAnExactAllow(t *testing.T) {
	cases := map[string]struct {
		allow []string
		ip    string
		want  bool
	}{
		"the address itself":        {[]string{"127.0.0.1"}, "127.0.0.1", true},
		"a single-address CIDR":     {[]string{"10.96.0.1/32"}, "10.96.0.1", true},
		"IPv4-mapped":               {[]string{"127.0.0.1/32"}, "::ffff:127.0.0.1", true},
		"the pod network around it": {[]string{"10.0.0.0/8"}, "10.96.0.1", false},
		"a host pattern":            {[]string{"*.svc.cluster.local"}, "10.96.0.1", false},
		"another address":           {[]string{"127.0.0.1/32"}, "127.0.0.2", false},
	}
	for name, tc := range cases {
		if got := allowedExactly(tc.allow, tc.ip); got != tc.want {
			t.Errorf("%s: allowedExactly(%v, %s) = %v, want %v", name, tc.allow, tc.ip, got, tc.want)
		}
	}
}
