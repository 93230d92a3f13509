package backend

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	etcdlock "github.com/lockwarden/lockwarden/internal/lock/etcd"
	pglock "github.com/lockwarden/lockwarden/internal/lock/postgres"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	zklock "github.com/lockwarden/lockwarden/internal/lock/zookeeper"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// These tests cover what a LockBackend or ClusterLockBackend naming
// PostgreSQL, ZooKeeper or etcd resolves to, connecting nowhere: the engine
// configuration with its credentials from the right namespace, the endpoint
// policy on every endpoint a tenant wrote, and a dialer that enforces it.

func storeLockBackend(name string, spec locksv1alpha1.LockBackendSpec) *locksv1alpha1.LockBackend {
	return &locksv1alpha1.LockBackend{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"}, Spec: spec}
}

func lockOnBackend(name string) *locksv1alpha1.DistributedLock {
	dl := lockWith(nil)
	dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: name}}
	return dl
}

func TestResolveOtherStores(t *testing.T) {
	t.Parallel()
	ref := func(name, key string) *locksv1alpha1.SecretKeyRef {
		return &locksv1alpha1.SecretKeyRef{Name: name, Key: key}
	}
	objs := []client.Object{
		secret("team-a", "pg", map[string]string{"password": "pg-secret"}),
		secret("team-a", "zk", map[string]string{"digest": "locks:zk-secret"}),
		secret("team-a", "etcd", map[string]string{"password": "etcd-secret"}),
		storeLockBackend("pg", locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{
				Host: "pg.team-a.svc", Database: "locks", User: "locker", PasswordSecretRef: ref("pg", "password"),
			}},
		}),
		storeLockBackend("zk", locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{
				Servers: []string{"zk-0.zk:2181", "zk-1.zk:2181", "zk-2.zk:2181"}, SessionTimeoutSeconds: 20, MaxClockSkewMilliseconds: 750, DigestSecretRef: ref("zk", "digest"),
			}},
		}),
		storeLockBackend("etcd", locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{
				Endpoints: []string{"etcd.team-a.svc:2379"}, Username: "locker", PasswordSecretRef: ref("etcd", "password"),
			}},
		}),
	}
	r := registryWith(t, deepCopies(objs)...)
	r.SetPolicy(Policy{}, nil)

	cfg, _, err := r.resolveAny(t.Context(), lockOnBackend("pg"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := cfg.Engine.(*pglock.Config); p == nil || p.Host != "pg.team-a.svc" || p.Port != 5432 || p.Database != "locks" || p.User != "locker" ||
		p.Password != "pg-secret" || p.Schema != "lockwarden" || p.Dial == nil || p.TLS != nil {
		t.Errorf("postgres config = %+v", cfg.Engine)
	}
	cfg, _, err = r.resolveAny(t.Context(), lockOnBackend("zk"))
	if err != nil {
		t.Fatal(err)
	}
	if z, _ := cfg.Engine.(*zklock.Config); z == nil || len(z.Servers) != 3 || z.Root != "/lockwarden" || z.SessionTimeout != 20*time.Second || z.MaxClockSkew != 750*time.Millisecond ||
		z.Digest != "locks:zk-secret" || z.Dial == nil {
		t.Errorf("zookeeper config = %+v", cfg.Engine)
	}
	cfg, _, err = r.resolveAny(t.Context(), lockOnBackend("etcd"))
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := cfg.Engine.(*etcdlock.Config); e == nil || !slices.Equal(e.Endpoints, []string{"etcd.team-a.svc:2379"}) || e.Prefix != "/lockwarden/" ||
		e.Username != "locker" || e.Password != "etcd-secret" || e.Dial == nil {
		t.Errorf("etcd config = %+v", cfg.Engine)
	}
}

// TestTenantStoresFollowTheEndpointPolicy: a LockBackend's PostgreSQL host,
// ZooKeeper servers and etcd endpoints are checked as inline Redis endpoints
// are, and refused by name before any connection.
func TestTenantStoresFollowTheEndpointPolicy(t *testing.T) {
	t.Parallel()
	policy, err := netguard.NewEndpointPolicy(nil, nil) // loopback, link-local and metadata denied
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		storeLockBackend("pg", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{Host: "127.0.0.1", Port: 5432, Database: "x", User: "x"}}}),
		storeLockBackend("zk", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk.team-a.svc:2181", "169.254.169.254:80"}}}}),
		storeLockBackend("etcd", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"[::1]:2379"}}}}),
		storeLockBackend("two", locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd:2379"}}, ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk:2181"}}},
		}),
	}
	cases := map[string]struct{ reason, field string }{
		"pg":   {locksv1alpha1.ReasonBackendNotAllowed, "LockBackend pg: spec.postgres.host"},
		"zk":   {locksv1alpha1.ReasonBackendNotAllowed, "LockBackend zk: spec.zookeeper.servers[1]"},
		"etcd": {locksv1alpha1.ReasonBackendNotAllowed, "LockBackend etcd: spec.etcd.endpoints[0]"},
		"two":  {locksv1alpha1.ReasonInvalidBackend, "spec.backend.backendRef.name"},
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(objs)...)
			r.SetPolicy(Policy{Endpoints: policy}, nil)
			err := r.Check(t.Context(), lockOnBackend(name))
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Reason != want.reason || pe.Field != want.field {
				t.Fatalf("Check = %v, want a refusal of %s with reason %s", err, want.field, want.reason)
			}
		})
	}
}

// TestStoreDialerEnforcesThePolicy: the dialer handed to the PostgreSQL,
// ZooKeeper and etcd clients refuses a denied address at connect time (a
// name that resolves there, say), and passes other bytes through untouched.
func TestStoreDialerEnforcesThePolicy(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("R\x00\x00\x00\x08")) // a PostgreSQL message, not RESP
			_ = c.Close()
		}
	}()
	denied, err := netguard.NewEndpointPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{storeLockBackend("pg", locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg.team-a.svc", Database: "x", User: "x"}}})}
	for name, tc := range map[string]struct {
		policy  *netguard.EndpointPolicy
		refused bool
	}{"denied": {denied, true}, "allowed": {allowed, false}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(objs)...)
			r.SetPolicy(Policy{Endpoints: tc.policy}, nil)
			cfg, _, err := r.resolveAny(t.Context(), lockOnBackend("pg"))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			conn, err := cfg.Engine.(*pglock.Config).Dial(ctx, "tcp", ln.Addr().String())
			if tc.refused {
				if !errors.Is(err, netguard.ErrDenied) {
					t.Fatalf("dial = %v, want ErrDenied", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			buf := make([]byte, 5)
			if _, err := conn.Read(buf); err != nil || string(buf) != "R\x00\x00\x00\x08" {
				t.Fatalf("read %q, %v: want the server's bytes untouched", buf, err)
			}
		})
	}
}

// TestTenantStoresGetShortOperationTimeouts: a PostgreSQL, ZooKeeper or
// etcd store a namespace chose gets TenantOperationTimeout per operation, so
// that a tenant's store answering at its full timeout holds a shared worker
// for a second per call, not the 2 s or 5 s an administrator's store may
// take; the same store behind a ClusterLockBackend keeps its default.
func TestTenantStoresGetShortOperationTimeouts(t *testing.T) {
	t.Parallel()
	specs := map[string]locksv1alpha1.LockBackendSpec{
		"pg":    {Store: locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg.infra.svc", Database: "locks", User: "locker"}}},
		"zk":    {Store: locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk.infra.svc:2181"}}}},
		"etcd":  {Store: locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd.infra.svc:2379"}}}},
		"redis": {Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra.svc:6379"}}}},
	}
	var objs []client.Object
	for name, spec := range specs {
		objs = append(objs, storeLockBackend(name, spec), &locksv1alpha1.ClusterLockBackend{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: locksv1alpha1.ClusterLockBackendSpec{
				Store:             spec.Store,
				NamespaceSelector: &metav1.LabelSelector{},
			},
		})
	}
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
	r := registryWith(t, deepCopies(objs)...)
	r.SetPolicy(Policy{ClusterResourceNamespace: "lockwarden-system"}, nil)
	for name := range specs {
		want := TenantOperationTimeout
		if name == "redis" {
			want = 0 // bounded per node call by the Redis engine itself
		}
		cfg, _, err := r.resolveAny(t.Context(), lockOnBackend(name))
		if err != nil {
			t.Fatalf("LockBackend %s: %v", name, err)
		}
		if cfg.OperationTimeout != want {
			t.Errorf("LockBackend %s: operation timeout %v, want %v", name, cfg.OperationTimeout, want)
		}
		cfg, _, err = r.resolveAny(t.Context(), lockOn("team-a", name, locksv1alpha1.ScopeNamespace))
		if err != nil {
			t.Fatalf("ClusterLockBackend %s: %v", name, err)
		}
		if cfg.OperationTimeout != 0 {
			t.Errorf("ClusterLockBackend %s: operation timeout %v, want the store's default (0)", name, cfg.OperationTimeout)
		}
	}
}

// The engines get the timeout the registry resolved: NewLocker hands it to
// each store's option, and without one the store keeps its default.
func TestNewLockerHandsTheOperationTimeoutToTheEngine(t *testing.T) {
	t.Parallel()
	stores := map[string]Config{
		"postgres":  {Store: "postgres", Engine: &pglock.Config{Host: "127.0.0.1", Port: 1, Database: "locks", User: "locker"}},
		"zookeeper": {Store: "zookeeper", Engine: &zklock.Config{Servers: []string{"127.0.0.1:1"}}},
		"etcd":      {Store: "etcd", Engine: &etcdlock.Config{Endpoints: []string{"127.0.0.1:1"}}},
	}
	defaults := map[string]time.Duration{"postgres": pglock.DefaultOperationTimeout, "zookeeper": zklock.DefaultOperationTimeout, "etcd": etcdlock.DefaultOpTimeout}
	for name, cfg := range stores {
		for _, timeout := range []time.Duration{TenantOperationTimeout, 0} {
			cfg.OperationTimeout = timeout
			l, err := NewLocker(logr.Discard())(cfg)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got := l.(interface{ OperationTimeout() time.Duration }).OperationTimeout()
			_ = l.Close()
			want := timeout
			if want == 0 {
				want = defaults[name]
			}
			if got != want {
				t.Errorf("%s with Config.OperationTimeout %v: the engine bounds operations at %v, want %v", name, timeout, got, want)
			}
		}
	}
}

// TestLockBackendRedisScopes: a LockBackend's Redis client authenticates
// as the user the LockBackend names and may use the namespace's keys only,
// and Global keys too where the operator allows the namespace Global scope
// on its own endpoints; a ClusterLockBackend's and an inline client are not
// limited. (TestLockBackendRunsOnItsNamespacesRedisUser in controllers runs
// Jobs on such a user.)
func TestLockBackendRedisScopes(t *testing.T) {
	t.Parallel()
	objs := []client.Object{
		secret("team-a", "redis-user", map[string]string{"password": "pw"}),
		storeLockBackend("redis", locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{
				Endpoints: []string{"redis.team-a.svc:6379"}, Username: "team-a-locks",
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-user", Key: "password"},
			}},
		}),
	}
	for _, tc := range []struct {
		name   string
		global GlobalScopePolicy
		want   []string
	}{
		{"Global not allowed", GlobalScopePolicy{}, []string{"ns/team-a/"}},
		{"Global allowed", GlobalScopePolicy{AllowAll: true}, []string{"ns/team-a/", "global/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := registryWith(t, deepCopies(objs)...)
			r.SetPolicy(Policy{GlobalScope: tc.global}, nil)
			cfg, _, err := r.resolveAny(t.Context(), lockOnBackend("redis"))
			if err != nil {
				t.Fatal(err)
			}
			if rc, _ := cfg.Engine.(*redislock.Config); rc == nil || rc.Username != "team-a-locks" || rc.Password != "pw" || !slices.Equal(rc.Scopes, tc.want) {
				t.Errorf("redis config = %+v, want user team-a-locks with scopes %q", cfg.Engine, tc.want)
			}
		})
	}
	r := registryWith(t)
	r.SetPolicy(Policy{}, nil)
	cfg, _, err := r.resolveAny(t.Context(), lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis.team-a.svc:6379"}}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Engine.(*redislock.Config).Scopes != nil {
		t.Errorf("inline redis config = %+v, want no scopes", cfg.Engine)
	}
}
