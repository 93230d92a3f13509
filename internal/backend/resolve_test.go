package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// These tests cover what a DistributedLock's backend resolves to without
// connecting anywhere: the Redis key names, the backend ID, and the client
// configuration built from the spec and its Secrets.

func TestEngineKeys(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		namespace string
		scope     locksv1alpha1.Scope
		want      []string
	}{
		"Namespace scope prefixes the namespace": {
			namespace: "team-a", scope: locksv1alpha1.ScopeNamespace,
			want: []string{"ns/team-a/billing/ledger", "ns/team-a/reports"},
		},
		"the same keys in another namespace are other keys": {
			namespace: "team-b", scope: locksv1alpha1.ScopeNamespace,
			want: []string{"ns/team-b/billing/ledger", "ns/team-b/reports"},
		},
		"Global scope uses the keys as written": {
			namespace: "team-a", scope: locksv1alpha1.ScopeGlobal,
			want: []string{"global/billing/ledger", "global/reports"},
		},
		"no scope is Namespace scope": {
			namespace: "team-a",
			want:      []string{"ns/team-a/billing/ledger", "ns/team-a/reports"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dl := &locksv1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: tc.namespace},
				Spec:       locksv1alpha1.DistributedLockSpec{Keys: []string{"billing/ledger", "reports"}, Scope: tc.scope},
			}
			if diff := cmp.Diff(tc.want, EngineKeys(dl)); diff != "" {
				t.Errorf("EngineKeys (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestID: locks whose backends have equal IDs share keys (and hear each
// other's releases); credentials and TLS settings do not change which keys a
// backend holds.
func TestID(t *testing.T) {
	t.Parallel()
	redlock := func(endpoints ...string) *locksv1alpha1.RedisBackend {
		return &locksv1alpha1.RedisBackend{Endpoints: endpoints}
	}
	cases := map[string]struct {
		a, b *locksv1alpha1.RedisBackend
		same bool
	}{
		"endpoints in another order": {
			a: redlock("a:6379", "b:6379", "c:6379"), b: redlock("c:6379", "a:6379", "b:6379"), same: true,
		},
		"another password, CA and server name": {
			a: redlock("redis:6379"),
			b: &locksv1alpha1.RedisBackend{
				Endpoints:         []string{"redis:6379"},
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis", Key: "password"},
				TLS:               &locksv1alpha1.BackendTLS{ServerName: "redis.internal", CASecretRef: &locksv1alpha1.SecretKeyRef{Name: "ca", Key: "ca.crt"}},
			},
			same: true,
		},
		"another sentinel password": {
			a:    &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "m"}},
			b:    &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "m", PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "s", Key: "p"}}},
			same: true,
		},
		"another database": {
			a: redlock("redis:6379"), b: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, DB: 1},
		},
		"another server": {
			a: redlock("redis-a:6379"), b: redlock("redis-b:6379"),
		},
		"one more Redlock master": {
			a: redlock("a:6379", "b:6379", "c:6379"), b: redlock("a:6379", "b:6379", "c:6379", "d:6379", "e:6379"),
		},
		"another master behind the same Sentinels": {
			a: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "billing"}},
			b: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "reports"}},
		},
		"a Sentinel and a server at the same address": {
			a: &locksv1alpha1.RedisBackend{Endpoints: []string{"host:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "m"}},
			b: redlock("host:26379"),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, b := ID(tc.a), ID(tc.b)
			if (a == b) != tc.same {
				t.Errorf("ID(a) = %q, ID(b) = %q; want equal: %v", a, b, tc.same)
			}
		})
	}
}

func secret(namespace, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func lockWith(rb *locksv1alpha1.RedisBackend) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "team-a"},
		Spec:       locksv1alpha1.DistributedLockSpec{Keys: []string{"ledger"}, Backend: locksv1alpha1.Backend{Redis: rb}},
	}
}

// registryWith returns a registry that reads Secrets from objs. It cannot
// build clients: resolving a backend connects nowhere.
func registryWith(t *testing.T, objs ...client.Object) *Registry {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(objs...).Build()
	return NewRegistry(t.Context(), c, nil, logr.Discard())
}

func newCA(t *testing.T, name string) []byte {
	t.Helper()
	ca, err := testpki.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca.PEM
}

// resolved is what a user configures of the Redis client, as resolve built it.
type resolved struct {
	Addrs            []string
	MasterName       string
	Password         string
	SentinelPassword string
	DB               int
	Prefix           string
	TLS              bool
	ServerName       string
	MinTLSVersion    uint16
	// RootCAs is "system" when the system roots are trusted, else the name
	// of the CA in cas that the pool holds ("unknown" when none).
	RootCAs string
	// MinReplicas is the engine's Sentinel replica count (0: its default).
	MinReplicas int
}

func resolvedOf(cfg redislock.Config, cas map[string][]byte) resolved {
	r := resolved{Addrs: cfg.Addrs, MasterName: cfg.MasterName, Password: cfg.Password, SentinelPassword: cfg.SentinelPassword, DB: cfg.DB, Prefix: cfg.Prefix, MinReplicas: cfg.MinReplicas}
	if cfg.TLS == nil {
		return r
	}
	r.TLS, r.ServerName, r.MinTLSVersion = true, cfg.TLS.ServerName, cfg.TLS.MinVersion
	if cfg.TLS.RootCAs == nil {
		r.RootCAs = "system"
		return r
	}
	r.RootCAs = "unknown"
	for name, pem := range cas {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		if pool.Equal(cfg.TLS.RootCAs) {
			r.RootCAs = name
		}
	}
	return r
}

func TestResolve(t *testing.T) {
	t.Parallel()
	caPEM := newCA(t, "redis-ca")
	secrets := []client.Object{
		secret("team-a", "redis-auth", map[string]string{"password": "s3cret"}),
		secret("team-a", "sentinel-auth", map[string]string{"password": "sentinel-s3cret"}),
		secret("team-a", "redis-ca", map[string]string{"ca.crt": string(caPEM)}),
	}
	cases := map[string]struct {
		backend *locksv1alpha1.RedisBackend
		want    resolved
	}{
		"a standalone server needs no Secret": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6379"}},
			want:    resolved{Addrs: []string{"redis.infra:6379"}, Prefix: KeyPrefix},
		},
		"database and password": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6379"}, DB: 3,
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}},
			want: resolved{Addrs: []string{"redis.infra:6379"}, DB: 3, Password: "s3cret", Prefix: KeyPrefix},
		},
		"Redlock masters in the order given": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"c:6379", "a:6379", "b:6379"}},
			want:    resolved{Addrs: []string{"c:6379", "a:6379", "b:6379"}, Prefix: KeyPrefix},
		},
		"Sentinels with their own password": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379", "s2:26379"},
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"},
				Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "billing",
					PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "sentinel-auth", Key: "password"}}},
			want: resolved{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "billing", Password: "s3cret", SentinelPassword: "sentinel-s3cret", Prefix: KeyPrefix},
		},
		"Sentinel without replica acknowledgements": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"},
				Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "billing", MinReplicas: ptr.To[int32](0)}},
			want: resolved{Addrs: []string{"s1:26379"}, MasterName: "billing", Prefix: KeyPrefix, MinReplicas: redislock.NoReplicas},
		},
		"Sentinel with two replica acknowledgements": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"},
				Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "billing", MinReplicas: ptr.To[int32](2)}},
			want: resolved{Addrs: []string{"s1:26379"}, MasterName: "billing", Prefix: KeyPrefix, MinReplicas: 2},
		},
		"TLS with the system roots": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6380"}, TLS: &locksv1alpha1.BackendTLS{}},
			want:    resolved{Addrs: []string{"redis.infra:6380"}, Prefix: KeyPrefix, TLS: true, MinTLSVersion: tls.VersionTLS12, RootCAs: "system"},
		},
		"TLS with a CA and a server name": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"10.0.0.7:6380"},
				TLS: &locksv1alpha1.BackendTLS{ServerName: "redis.internal", CASecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-ca", Key: "ca.crt"}}},
			want: resolved{Addrs: []string{"10.0.0.7:6380"}, Prefix: KeyPrefix, TLS: true, ServerName: "redis.internal", MinTLSVersion: tls.VersionTLS12,
				RootCAs: "redis-ca"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(secrets)...)
			cfg, id, _, err := r.resolveLock(t.Context(), lockWith(tc.backend))
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			if diff := cmp.Diff(tc.want, resolvedOf(cfg, map[string][]byte{"redis-ca": caPEM})); diff != "" {
				t.Errorf("Redis configuration (-want,+got):\n%s", diff)
			}
			if want := ID(tc.backend); id != want {
				t.Errorf("backend ID = %q, want ID(spec) = %q", id, want)
			}
		})
	}
}

func TestResolveRefusals(t *testing.T) {
	t.Parallel()
	password := &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}
	ca := &locksv1alpha1.SecretKeyRef{Name: "redis-ca", Key: "ca.crt"}
	cases := map[string]struct {
		secrets   []client.Object
		backend   *locksv1alpha1.RedisBackend
		wantType  string // "secret" (*SecretError), "config" (*ConfigError) or "policy" (*PolicyError)
		wantField string
		wantText  []string
	}{
		"no backend": {
			wantType: "policy", wantField: "spec.backend", wantText: []string{"set redis", "or clusterBackendRef"},
		},
		"password Secret missing": {
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: password},
			wantType: "secret", wantField: "spec.backend.redis.passwordSecretRef",
			wantText: []string{"team-a/redis-auth was not found"},
		},
		"password Secret only in another namespace": {
			secrets:  []client.Object{secret("default", "redis-auth", map[string]string{"password": "s3cret"})},
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: password},
			wantType: "secret", wantField: "spec.backend.redis.passwordSecretRef",
			wantText: []string{"team-a/redis-auth was not found"},
		},
		"password Secret without the key": {
			secrets:  []client.Object{secret("team-a", "redis-auth", map[string]string{"pass": "s3cret"})},
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: password},
			wantType: "secret", wantField: "spec.backend.redis.passwordSecretRef",
			wantText: []string{`team-a/redis-auth has no key "password"`},
		},
		"Sentinel password Secret missing": {
			backend: &locksv1alpha1.RedisBackend{Endpoints: []string{"s1:26379"},
				Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "m", PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "sentinel-auth", Key: "password"}}},
			wantType: "secret", wantField: "spec.backend.redis.sentinel.passwordSecretRef",
			wantText: []string{"team-a/sentinel-auth was not found"},
		},
		"CA Secret missing": {
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6380"}, TLS: &locksv1alpha1.BackendTLS{CASecretRef: ca}},
			wantType: "secret", wantField: "spec.backend.redis.tls.caSecretRef",
			wantText: []string{"team-a/redis-ca was not found"},
		},
		"CA that is no PEM certificate": {
			secrets:  []client.Object{secret("team-a", "redis-ca", map[string]string{"ca.crt": "not a certificate"})},
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6380"}, TLS: &locksv1alpha1.BackendTLS{CASecretRef: ca}},
			wantType: "config", wantField: "spec.backend.redis.tls.caSecretRef",
			wantText: []string{`team-a/redis-ca key "ca.crt" holds no PEM certificate`},
		},
		"password over the size limit": {
			secrets:  []client.Object{secret("team-a", "redis-auth", map[string]string{"password": strings.Repeat("x", 64<<10+1)})},
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: password},
			wantType: "secret", wantField: "spec.backend.redis.passwordSecretRef",
			wantText: []string{`team-a/redis-auth key "password" holds 65537 bytes`, "at most 64 KiB"},
		},
		"CA bundle over the size limit": {
			secrets:  []client.Object{secret("team-a", "redis-ca", map[string]string{"ca.crt": strings.Repeat("x", 512<<10+1)})},
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6380"}, TLS: &locksv1alpha1.BackendTLS{CASecretRef: ca}},
			wantType: "secret", wantField: "spec.backend.redis.tls.caSecretRef",
			wantText: []string{`team-a/redis-ca key "ca.crt" holds 524289 bytes`, "at most 512 KiB"},
		},
		"two Redlock masters": {
			backend:  &locksv1alpha1.RedisBackend{Endpoints: []string{"a:6379", "b:6379"}},
			wantType: "config", wantField: "spec.backend.redis",
			wantText: []string{"3, 5 or 7"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(tc.secrets)...)
			_, _, _, err := r.resolveLock(t.Context(), lockWith(tc.backend))
			var field string
			var secretErr *SecretError
			var configErr *ConfigError
			var policyErr *PolicyError
			switch {
			case tc.wantType == "secret" && errors.As(err, &secretErr):
				field = secretErr.Field
			case tc.wantType == "config" && errors.As(err, &configErr):
				field = configErr.Field
			case tc.wantType == "policy" && errors.As(err, &policyErr):
				field = policyErr.Field
			default:
				t.Fatalf("resolve = %v (%T), want a %s error", err, err, tc.wantType)
			}
			if field != tc.wantField {
				t.Errorf("error names field %q, want %q", field, tc.wantField)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestCredentialsChangeTheClientNotTheKeys: a backend's ID says which keys
// it holds, its fingerprint which client reaches them. A rotated password or
// CA needs a new client for the same keys.
func TestCredentialsChangeTheClientNotTheKeys(t *testing.T) {
	t.Parallel()
	caA, caB := newCA(t, "ca-a"), newCA(t, "ca-b")
	base := func() (*locksv1alpha1.DistributedLock, map[string]string) {
		dl := lockWith(&locksv1alpha1.RedisBackend{
			Endpoints:         []string{"a:6379", "b:6379", "c:6379"},
			PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis", Key: "password"},
			TLS:               &locksv1alpha1.BackendTLS{ServerName: "redis.internal", CASecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis", Key: "ca.crt"}},
		})
		return dl, map[string]string{"password": "s3cret", "ca.crt": string(caA)}
	}
	cases := map[string]struct {
		change                     func(dl *locksv1alpha1.DistributedLock, data map[string]string)
		sameID, sameClientSettings bool
	}{
		"another lock on the same backend": {
			change: func(dl *locksv1alpha1.DistributedLock, _ map[string]string) { dl.Name = "reports" },
			sameID: true, sameClientSettings: true,
		},
		"the masters listed in another order": {
			change: func(dl *locksv1alpha1.DistributedLock, _ map[string]string) {
				dl.Spec.Backend.Redis.Endpoints = []string{"c:6379", "b:6379", "a:6379"}
			},
			sameID: true, sameClientSettings: true,
		},
		"a rotated password": {
			change: func(_ *locksv1alpha1.DistributedLock, data map[string]string) { data["password"] = "rotated" },
			sameID: true,
		},
		"a rotated CA": {
			change: func(_ *locksv1alpha1.DistributedLock, data map[string]string) { data["ca.crt"] = string(caB) },
			sameID: true,
		},
		"another server name": {
			change: func(dl *locksv1alpha1.DistributedLock, _ map[string]string) {
				dl.Spec.Backend.Redis.TLS.ServerName = "other"
			},
			sameID: true,
		},
		"TLS turned off": {
			change: func(dl *locksv1alpha1.DistributedLock, _ map[string]string) { dl.Spec.Backend.Redis.TLS = nil },
			sameID: true,
		},
		"another database": {
			change: func(dl *locksv1alpha1.DistributedLock, _ map[string]string) { dl.Spec.Backend.Redis.DB = 2 },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resolve := func(dl *locksv1alpha1.DistributedLock, data map[string]string) (id, fingerprint string) {
				t.Helper()
				r := registryWith(t, secret("team-a", "redis", data))
				_, id, fingerprint, err := r.resolveLock(t.Context(), dl)
				if err != nil {
					t.Fatalf("resolve: %v", err)
				}
				return id, fingerprint
			}
			id1, fp1 := resolve(base())
			dl, data := base()
			tc.change(dl, data)
			id2, fp2 := resolve(dl, data)
			if (id1 == id2) != tc.sameID {
				t.Errorf("IDs %q and %q; want equal: %v", id1, id2, tc.sameID)
			}
			if (fp1 == fp2) != tc.sameClientSettings {
				t.Errorf("fingerprints %s and %s; want equal (one shared client): %v", fp1, fp2, tc.sameClientSettings)
			}
		})
	}
}

// TestAFailedSecretReadIsRetriedAtOnce: an API server hiccup is reported on
// the field that needs the Secret, and the next reconcile reads again rather
// than reusing the failure.
func TestAFailedSecretReadIsRetriedAtOnce(t *testing.T) {
	t.Parallel()
	hiccup := errors.New("etcdserver: request timed out")
	var failures atomic.Int64
	failures.Store(1)
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).
		WithObjects(secret("team-a", "redis-auth", map[string]string{"password": "s3cret"})).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if failures.Add(-1) >= 0 {
					return hiccup
				}
				return c.Get(ctx, key, obj, opts...)
			},
		}).Build()
	r := NewRegistry(t.Context(), c, nil, logr.Discard())
	dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}})

	_, _, _, err := r.resolveLock(t.Context(), dl)
	var secretErr *SecretError
	if !errors.As(err, &secretErr) || secretErr.Field != "spec.backend.redis.passwordSecretRef" || !errors.Is(err, hiccup) {
		t.Fatalf("first resolve = %v, want a SecretError on spec.backend.redis.passwordSecretRef wrapping %q", err, hiccup)
	}
	cfg, _, _, err := r.resolveLock(t.Context(), dl)
	if err != nil {
		t.Fatalf("second resolve: %v", err)
	}
	if cfg.Password != "s3cret" {
		t.Errorf("password = %q after the API server answered again, want the Secret's", cfg.Password)
	}
}

func deepCopies(objs []client.Object) []client.Object {
	out := make([]client.Object, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopyObject().(client.Object)
	}
	return out
}

// resolveLock checks dl against the registry's policy and resolves its
// backend, as For does before it builds a client.
func (r *Registry) resolveLock(ctx context.Context, dl *locksv1alpha1.DistributedLock) (redislock.Config, string, string, error) {
	src, err := r.check(ctx, dl)
	if err != nil {
		return redislock.Config{}, "", "", err
	}
	cfg, fingerprint, err := r.resolve(ctx, src)
	if _, ok := cfg.Engine.(*redislock.Config); !ok {
		return redislock.Config{}, src.id, fingerprint, err
	}
	return *cfg.Engine.(*redislock.Config), src.id, fingerprint, err
}

// resolveAny is resolveLock for every store.
func (r *Registry) resolveAny(ctx context.Context, dl *locksv1alpha1.DistributedLock) (Config, string, error) {
	src, err := r.check(ctx, dl)
	if err != nil {
		return Config{}, "", err
	}
	return r.resolve(ctx, src)
}
