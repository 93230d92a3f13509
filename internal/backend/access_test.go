package backend

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// These tests cover the one decision the manual holder, gated Jobs and the
// admission webhook share: may this lock use its backend with its scope?
// Nothing connects anywhere.

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// clusterBackend returns a Redis ClusterLockBackend; globalKeyPrefixes, when
// given, restrict the keys of its Global locks.
func clusterBackend(name string, nsSel, globalSel *metav1.LabelSelector, globalKeyPrefixes ...string) *locksv1alpha1.ClusterLockBackend {
	return &locksv1alpha1.ClusterLockBackend{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: locksv1alpha1.ClusterLockBackendSpec{
			Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{
				Endpoints:         []string{"redis.infra.svc:6379"},
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "shared-redis", Key: "password"},
			}},
			NamespaceSelector:            nsSel,
			GlobalScopeNamespaceSelector: globalSel,
			GlobalKeyPrefixes:            globalKeyPrefixes,
		},
	}
}

func lockOn(namespace, backendName string, scope locksv1alpha1.Scope) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: namespace},
		Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"}, Scope: scope,
			Backend: locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: backendName}}},
	}
}

// withKeys sets the keys of dl.
func withKeys(dl *locksv1alpha1.DistributedLock, keys ...string) *locksv1alpha1.DistributedLock {
	dl.Spec.Keys = keys
	return dl
}

func TestClusterBackendPolicy(t *testing.T) {
	t.Parallel()
	team := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "billing"}}
	objs := []client.Object{
		namespace("billing", map[string]string{"team": "billing"}),
		namespace("web", map[string]string{"team": "web"}),
		clusterBackend("everyone", &metav1.LabelSelector{}, team),
		clusterBackend("billing-only", team, nil),
		clusterBackend("billing-global", &metav1.LabelSelector{}, team, "billing/", "shared/billing-"),
		clusterBackend("not-web", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"web"}}}}, nil),
		clusterBackend("typo", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Equals", Values: []string{"web"}}}}, nil),
		// The admin's Secret, in the operator's namespace; a tenant's
		// Secret of the same name must never be used.
		secret("lockwarden-system", "shared-redis", map[string]string{"password": "admin-secret"}),
		secret("web", "shared-redis", map[string]string{"password": "tenant-secret"}),
	}
	cases := map[string]struct {
		lock       *locksv1alpha1.DistributedLock
		wantReason string // "" = allowed
		wantField  string // "" = any
		wantText   []string
	}{
		"a selected namespace":                    {lock: lockOn("web", "everyone", "")},
		"Global where the backend allows it":      {lock: lockOn("billing", "everyone", locksv1alpha1.ScopeGlobal)},
		"a namespace the backend does not select": {lock: lockOn("web", "billing-only", ""), wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantText: []string{`"billing-only" may not be used from namespace "web"`}},
		"Global where the backend does not allow it": {lock: lockOn("web", "everyone", locksv1alpha1.ScopeGlobal), wantReason: locksv1alpha1.ReasonScopeNotAllowed,
			wantText: []string{`Global is not allowed in namespace "web" on ClusterLockBackend "everyone"`}},
		"Global on a backend without a Global selector": {lock: lockOn("billing", "billing-only", locksv1alpha1.ScopeGlobal), wantReason: locksv1alpha1.ReasonScopeNotAllowed},
		"a backend whose selector is invalid": {lock: lockOn("web", "typo", ""), wantReason: locksv1alpha1.ReasonInvalidBackend,
			wantText: []string{`ClusterLockBackend "typo" cannot be used`, "spec.namespaceSelector", `"Equals" is not a valid`}},
		"a negative selector, a selected namespace": {lock: lockOn("billing", "not-web", "")},
		// Fails closed: an unseen namespace is not one without labels.
		"a negative selector, a namespace not found": {lock: lockOn("ghost", "not-web", ""), wantReason: locksv1alpha1.ReasonBackendNotAllowed,
			wantText: []string{`namespace "ghost" was not found`}},
		"a backend that does not exist": {lock: lockOn("billing", "nope", ""), wantReason: locksv1alpha1.ReasonBackendNotFound,
			wantText: []string{`ClusterLockBackend "nope" does not exist`, "kubectl get clusterlockbackends"}},
		// spec.globalKeyPrefixes: which Global keys a backend allows.
		"Global keys that each start with an allowed prefix": {lock: withKeys(lockOn("billing", "billing-global", locksv1alpha1.ScopeGlobal), "billing/ledger", "shared/billing-export")},
		"a Global key outside the allowed prefixes": {lock: withKeys(lockOn("billing", "billing-global", locksv1alpha1.ScopeGlobal), "billing/ledger", "ledger/compaction"),
			wantReason: locksv1alpha1.ReasonScopeNotAllowed, wantField: "spec.keys[1]",
			wantText: []string{`Global key "ledger/compaction" is not allowed on ClusterLockBackend "billing-global"`, `starting with "billing/" or "shared/billing-"`, "scope Namespace"}},
		"any Global key without globalKeyPrefixes":            {lock: withKeys(lockOn("billing", "everyone", locksv1alpha1.ScopeGlobal), "ledger/compaction")},
		"scope Namespace on a backend with globalKeyPrefixes": {lock: withKeys(lockOn("billing", "billing-global", locksv1alpha1.ScopeNamespace), "ledger/compaction")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(objs)...)
			r.SetPolicy(Policy{ClusterResourceNamespace: "lockwarden-system"}, nil)
			cfg, id, _, err := r.resolveLock(t.Context(), tc.lock)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("resolve = %v, want allowed", err)
				}
				if cfg.Password != "admin-secret" {
					t.Errorf("password = %q, want the one from the operator's namespace", cfg.Password)
				}
				if cfg.EndpointPolicy != nil {
					t.Error("an admin-owned backend was given the endpoint policy of inline endpoints")
				}
				if want := "ClusterLockBackend/" + tc.lock.Spec.Backend.ClusterBackendRef.Name; id != want || LockBackendID(tc.lock) != want {
					t.Errorf("backend ID = %q (index %q), want %q", id, LockBackendID(tc.lock), want)
				}
				return
			}
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Reason != tc.wantReason {
				t.Fatalf("resolve = %v, want a refusal with reason %s", err, tc.wantReason)
			}
			if tc.wantField != "" && pe.Field != tc.wantField {
				t.Errorf("refusal names %s, want %s", pe.Field, tc.wantField)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(pe.Error(), w) {
					t.Errorf("refusal %q does not contain %q", pe.Error(), w)
				}
			}
		})
	}
}

func TestInlineEndpointPolicy(t *testing.T) {
	t.Parallel()
	strict, err := netguard.NewEndpointPolicy([]string{"*.redis.svc.cluster.local", "10.20.0.0/16"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	patterns, err := netguard.NewEndpointPolicy([]string{"*.redis.svc.cluster.local"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	open, err := netguard.NewEndpointPolicy(nil, []string{"10.96.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	labelled := namespace("shared", map[string]string{"lockwarden.io/allow-global-scope": "true"})
	cases := map[string]struct {
		policy     Policy
		endpoints  []string
		scope      locksv1alpha1.Scope
		namespace  string
		wantReason string
		wantField  string
	}{
		"anywhere without a policy":                {endpoints: []string{"127.0.0.1:6379"}},
		"an allowed host pattern":                  {policy: Policy{Endpoints: strict}, endpoints: []string{"locks.redis.svc.cluster.local:6379"}},
		"an allowed CIDR":                          {policy: Policy{Endpoints: strict}, endpoints: []string{"10.20.3.4:6379"}},
		"a host outside the allow-list":            {policy: Policy{Endpoints: patterns}, endpoints: []string{"a.redis.svc.cluster.local:6379", "evil.example.com:6379"}, wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "spec.backend.redis.endpoints[1]"},
		"cloud metadata":                           {policy: Policy{Endpoints: open}, endpoints: []string{"169.254.169.254:80"}, wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "spec.backend.redis.endpoints[0]"},
		"loopback":                                 {policy: Policy{Endpoints: open}, endpoints: []string{"localhost:6379"}, wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "spec.backend.redis.endpoints[0]"},
		"the API server":                           {policy: Policy{Endpoints: open}, endpoints: []string{"10.96.0.1:443"}, wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "spec.backend.redis.endpoints[0]"},
		"inline endpoints turned off":              {policy: Policy{InlineDisabled: true}, endpoints: []string{"redis:6379"}, wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "spec.backend.redis"},
		"Global without the operator's permission": {endpoints: []string{"redis:6379"}, scope: locksv1alpha1.ScopeGlobal, wantReason: locksv1alpha1.ReasonScopeNotAllowed, wantField: "spec.scope"},
		"Global in a labelled namespace": {policy: Policy{GlobalScope: GlobalScopePolicy{NamespaceLabel: "lockwarden.io/allow-global-scope"}},
			endpoints: []string{"redis:6379"}, scope: locksv1alpha1.ScopeGlobal, namespace: "shared"},
		"Global in an unlabelled namespace": {policy: Policy{GlobalScope: GlobalScopePolicy{NamespaceLabel: "lockwarden.io/allow-global-scope"}},
			endpoints: []string{"redis:6379"}, scope: locksv1alpha1.ScopeGlobal, wantReason: locksv1alpha1.ReasonScopeNotAllowed, wantField: "spec.scope"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, labelled.DeepCopy())
			r.SetPolicy(tc.policy, nil)
			dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: tc.endpoints})
			dl.Spec.Scope = tc.scope
			if tc.namespace != "" {
				dl.Namespace = tc.namespace
			}
			err := r.Check(t.Context(), dl)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("Check = %v, want allowed", err)
				}
				cfg, _, _, err := r.resolveLock(t.Context(), dl)
				if err != nil || cfg.EndpointPolicy != tc.policy.Endpoints {
					t.Fatalf("resolve = %v; the client must dial through the inline endpoint policy", err)
				}
				return
			}
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Reason != tc.wantReason || pe.Field != tc.wantField {
				t.Fatalf("Check = %v, want a refusal of %s with reason %s", err, tc.wantField, tc.wantReason)
			}
		})
	}
}

// A LockBackend is the namespace's own: its Secrets come from the lock's
// namespace and its endpoints pass the same policy as inline ones.
func TestLockBackendPolicy(t *testing.T) {
	t.Parallel()
	loopbackDenied, err := netguard.NewEndpointPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	lb := func(name string, endpoints ...string) *locksv1alpha1.LockBackend {
		return &locksv1alpha1.LockBackend{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"},
			Spec: locksv1alpha1.LockBackendSpec{
				Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: endpoints,
					PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}}},
			},
		}
	}
	objs := []client.Object{
		lb("team-redis", "redis.team-a.svc:6379"), lb("sneaky", "127.0.0.1:22"),
		secret("team-a", "redis-auth", map[string]string{"password": "team-secret"}),
		lb("elsewhere", "redis.team-b.svc:6379"),
	}
	objs[3].SetNamespace("team-b")
	ref := func(name string) *locksv1alpha1.DistributedLock {
		dl := lockWith(nil)
		dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: name}}
		return dl
	}
	cases := map[string]struct {
		policy     Policy
		lock       *locksv1alpha1.DistributedLock
		wantReason string
		wantField  string
	}{
		"the namespace's backend":       {policy: Policy{Endpoints: loopbackDenied}, lock: ref("team-redis")},
		"an endpoint the policy denies": {policy: Policy{Endpoints: loopbackDenied}, lock: ref("sneaky"), wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "LockBackend sneaky: spec.redis.endpoints[0]"},
		"another namespace's backend":   {lock: ref("elsewhere"), wantReason: locksv1alpha1.ReasonBackendNotFound, wantField: "spec.backend.backendRef.name"},
		"tenant endpoints turned off":   {policy: Policy{InlineDisabled: true}, lock: ref("team-redis"), wantReason: locksv1alpha1.ReasonBackendNotAllowed, wantField: "LockBackend team-redis: spec.redis"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(objs)...)
			r.SetPolicy(tc.policy, nil)
			cfg, id, _, err := r.resolveLock(t.Context(), tc.lock)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("resolve = %v, want allowed", err)
				}
				if cfg.Password != "team-secret" || cfg.EndpointPolicy != tc.policy.Endpoints || id != "LockBackend/team-a/team-redis" || LockBackendID(tc.lock) != id {
					t.Errorf("password %q, policy %p (want %p), ID %q (index %q)", cfg.Password, cfg.EndpointPolicy, tc.policy.Endpoints, id, LockBackendID(tc.lock))
				}
				return
			}
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Reason != tc.wantReason || pe.Field != tc.wantField {
				t.Fatalf("resolve = %v, want a refusal of %s with reason %s", err, tc.wantField, tc.wantReason)
			}
		})
	}
}
