package chart

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/manager"
)

// checkInline renders the chart with set, starts the manager's policy from
// the Deployment's args as the manager does, and checks a tenant's lock
// with an inline endpoint against it.
func checkInline(t *testing.T, endpoint string, set ...string) error {
	t.Helper()
	objs := render(t, releaseName, releaseNamespace, set...)
	args := managerArgs(t, find(t, objs, "Deployment", releasePrefix+"controller-manager"))
	o, err := manager.ParseFlags(args)
	if err != nil {
		t.Fatalf("the manager refuses the chart's args %q: %v", args, err)
	}
	policy, err := o.FlagEndpointPolicy()
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = locksv1alpha1.AddToScheme(scheme)
	r := backend.NewRegistry(t.Context(), fake.NewClientBuilder().WithScheme(scheme).Build(), nil, log.Log)
	r.SetPolicy(o.BackendPolicy(policy), nil)
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "nightly"},
		Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"billing"}, TTLSeconds: 30,
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{endpoint}}}},
	}
	return r.Check(t.Context(), dl)
}

// Installed with its defaults, the chart refuses endpoints a tenant chooses
// (a fresh install is not open to every address a namespace names), with a
// message naming the value that would allow them; once an administrator
// lists addresses, those are allowed and the others refused.
func TestDefaultInstallRefusesInlineEndpoints(t *testing.T) {
	err := checkInline(t, "redis.team-a.svc.cluster.local:6379")
	var pe *backend.PolicyError
	if !errors.As(err, &pe) || pe.Reason != locksv1alpha1.ReasonBackendNotAllowed || pe.Field != "spec.backend.redis" ||
		!strings.Contains(pe.Message, "endpointPolicy.allow") || !strings.Contains(pe.Message, "--endpoint-allow") {
		t.Fatalf("with the chart's defaults an inline endpoint gets %v; want BackendNotAllowed on spec.backend.redis naming endpointPolicy.allow and --endpoint-allow", err)
	}
	t.Logf("refused: %s", pe.Message)

	allow := "endpointPolicy.allow={*.redis.svc.cluster.local,10.20.0.0/16}"
	if err := checkInline(t, "locks.redis.svc.cluster.local:6379", allow); err != nil {
		t.Errorf("an endpoint the allow-list names: %v; want it allowed", err)
	}
	if err := checkInline(t, "10.30.0.1:6379", allow); !errors.As(err, &pe) || pe.Field != "spec.backend.redis.endpoints[0]" {
		t.Errorf("an endpoint outside the allow-list: %v; want it refused on spec.backend.redis.endpoints[0]", err)
	}
	if err := checkInline(t, "anything.example.com:6379", "endpointPolicy.allow={*}"); err != nil {
		t.Errorf("with allow [*]: %v; want any address but the denied ones", err)
	}
	if err := checkInline(t, "169.254.169.254:80", "endpointPolicy.allow={*}"); !errors.As(err, &pe) {
		t.Errorf("cloud metadata with allow [*]: %v; want it still denied", err)
	}
}
