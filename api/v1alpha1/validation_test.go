package v1alpha1_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// env is the API server the tests submit to; nil with -short.
var env *kubetest.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // without an API server: the tests that need one skip
	}
	e, err := kubetest.StartEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	code := m.Run()
	_ = e.Stop()
	os.Exit(code)
}

// needEnv skips a test that submits to the API server when it was not started (-short).
func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd; skipped with -short")
	}
}

func validLock(name string) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{"billing/ledger"},
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6379"}}},
		},
	}
}

// TestInvalidSpecsAreRefusedNamingTheField submits each invalid spec to the
// real API server and checks that it is refused with a message that names
// the field and what would be valid.
func TestInvalidSpecsAreRefusedNamingTheField(t *testing.T) {
	needEnv(t)
	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	cases := map[string]struct {
		mutate func(*locksv1alpha1.DistributedLockSpec)
		want   []string // substrings of the error message
	}{
		"no keys": {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{} }, []string{"set exactly one of keys", "or keyFrom"}},
		"keys and keyFrom": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.KeyFrom = &locksv1alpha1.KeyFrom{Expression: `"k"`}
		}, []string{"set exactly one of keys", "or keyFrom"}},
		"maxKeys without keyFrom": {func(s *locksv1alpha1.DistributedLockSpec) { s.MaxKeys = 3 }, []string{"spec.maxKeys applies only with spec.keyFrom"}},
		"keyFrom with a manual holder": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Keys, s.KeyFrom, s.Holder = nil, &locksv1alpha1.KeyFrom{Expression: `"k"`}, &locksv1alpha1.ManualHolder{Identity: "ops"}
		}, []string{"spec.holder needs spec.keys"}},
		"too many keys":            {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = many }, []string{"spec.keys", "at most 16"}},
		"duplicate keys":           {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{"a", "a"} }, []string{"spec.keys[1]", "Duplicate value"}},
		"key with a space":         {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{"bad key"} }, []string{"spec.keys[0]", "should match"}},
		"key starting with a dash": {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{"-x"} }, []string{"spec.keys[0]", "should match"}},
		"key too long":             {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{strings.Repeat("k", 201)} }, []string{"spec.keys[0]", "200"}},
		"ttl below the minimum":    {func(s *locksv1alpha1.DistributedLockSpec) { s.TTLSeconds = 4 }, []string{"spec.ttlSeconds", "greater than or equal to 5"}},
		"redis user name with a line break": {func(s *locksv1alpha1.DistributedLockSpec) { s.Backend.Redis.Username = "locks\r\nFLUSHALL" },
			[]string{"spec.backend.redis.username", "should match"}},
		"ttl above the maximum": {func(s *locksv1alpha1.DistributedLockSpec) { s.TTLSeconds = 86401 }, []string{"spec.ttlSeconds", "less than or equal to 86400"}},
		"unknown scope":         {func(s *locksv1alpha1.DistributedLockSpec) { s.Scope = "Cluster" }, []string{"spec.scope", `"Namespace", "Global"`}},
		"unknown contention":    {func(s *locksv1alpha1.DistributedLockSpec) { s.Contention = "Wait" }, []string{"spec.contention", `"Queue", "QueueLatest", "ReplaceQueued", "CancelInProgress", "Skip"`}},
		"cancel in progress on a semaphore": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Contention, s.MaxHolders = locksv1alpha1.ContentionCancelInProgress, 3
		}, []string{"spec.contention CancelInProgress needs maxHolders 1", "ReplaceQueued"}},
		"too many holders":      {func(s *locksv1alpha1.DistributedLockSpec) { s.MaxHolders = 101 }, []string{"spec.maxHolders", "100"}},
		"negative holders":      {func(s *locksv1alpha1.DistributedLockSpec) { s.MaxHolders = -1 }, []string{"spec.maxHolders", "1"}},
		"negative maximum wait": {func(s *locksv1alpha1.DistributedLockSpec) { s.MaxWaitSeconds = -5 }, []string{"spec.maxWaitSeconds", "1"}},
		"negative maximum hold": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Holder = &locksv1alpha1.ManualHolder{Identity: "m", MaxHoldSeconds: -1}
		}, []string{"spec.holder.maxHoldSeconds", "1"}},
		"unknown onLost": {func(s *locksv1alpha1.DistributedLockSpec) { s.OnLost = "Kill" }, []string{"spec.onLost", `"Ignore", "Terminate"`}},
		"empty holder identity": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Holder = &locksv1alpha1.ManualHolder{Identity: ""}
		}, []string{"spec.holder.identity", "at least 1"}},
		"holder identity too long": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Holder = &locksv1alpha1.ManualHolder{Identity: strings.Repeat("m", 129)}
		}, []string{"spec.holder.identity", "128"}},
		"holder identity posing as a Job": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Holder = &locksv1alpha1.ManualHolder{Identity: "prod/payments/Job/nightly-settlement/3f2a1"}
		}, []string{"spec.holder.identity", "must not contain '/'"}},
		"no backend": {func(s *locksv1alpha1.DistributedLockSpec) { s.Backend.Redis = nil }, []string{"spec.backend", "exactly one of redis", "clusterBackendRef"}},
		"two backends": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.ClusterBackendRef = &locksv1alpha1.ClusterBackendRef{Name: "shared"}
		}, []string{"spec.backend", "exactly one of redis", "clusterBackendRef"}},
		"bad backend name": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis, s.Backend.ClusterBackendRef = nil, &locksv1alpha1.ClusterBackendRef{Name: "Shared_Redis"}
		}, []string{"spec.backend.clusterBackendRef.name", "should match"}},
		"no endpoints": {func(s *locksv1alpha1.DistributedLockSpec) { s.Backend.Redis.Endpoints = []string{} }, []string{"spec.backend.redis.endpoints", "at least 1"}},
		"even number of masters": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"a:6379", "b:6379"}
		}, []string{"spec.backend.redis", "1 server (standalone) or 3, 5 or 7"}},
		"more than seven masters": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}
		}, []string{"spec.backend.redis.endpoints", "at most 7"}},
		"endpoint without a port": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"redis.infra"}
		}, []string{"spec.backend.redis.endpoints[0]", "should match"}},
		"database index out of range": {func(s *locksv1alpha1.DistributedLockSpec) { s.Backend.Redis.DB = 16 }, []string{"spec.backend.redis.db", "less than or equal to 15"}},
		"password secret without a name": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: "", Key: "password"}
		}, []string{"spec.backend.redis.passwordSecretRef.name", "at least 1"}},
		"password secret key with a space": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: "redis", Key: "pass word"}
		}, []string{"spec.backend.redis.passwordSecretRef.key", "should match"}},
		"sentinel without a master name": {func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Sentinel = &locksv1alpha1.RedisSentinel{}
		}, []string{"spec.backend.redis.sentinel.masterName", "at least 1"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dl := validLock(strings.ReplaceAll(name, " ", "-"))
			tc.mutate(&dl.Spec)
			err := env.Client.Create(context.Background(), dl)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v, want Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidSpecsAreAccepted(t *testing.T) {
	needEnv(t)
	cases := map[string]func(*locksv1alpha1.DistributedLockSpec){
		"standalone with defaults": func(*locksv1alpha1.DistributedLockSpec) {},
		"redlock of five": func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"a:6379", "b:6379", "c:6379", "d:6379", "e:6379"}
		},
		"sentinels, any number": func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"s1:26379", "s2:26379"}
			s.Backend.Redis.Sentinel = &locksv1alpha1.RedisSentinel{MasterName: "mymaster"}
		},
		"ipv6 endpoint, tls, password and a manual holder": func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis.Endpoints = []string{"[::1]:6379"}
			s.Backend.Redis.TLS = &locksv1alpha1.BackendTLS{CASecretRef: &locksv1alpha1.SecretKeyRef{Name: "ca", Key: "ca.crt"}}
			s.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: "redis", Key: "password"}
			s.Holder = &locksv1alpha1.ManualHolder{Identity: "maintenance window 2026-12-01"}
			s.Keys = []string{"billing/ledger", "ledger:compaction", "a.b_c-d"}
		},
		"a cluster backend by name": func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis, s.Backend.ClusterBackendRef = nil, &locksv1alpha1.ClusterBackendRef{Name: "shared-redis"}
		},
		"a namespace backend by name": func(s *locksv1alpha1.DistributedLockSpec) {
			s.Backend.Redis, s.Backend.BackendRef = nil, &locksv1alpha1.BackendRef{Name: "team-redis"}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			dl := validLock("ok-" + strings.ReplaceAll(strings.ReplaceAll(name, " ", "-"), ",", ""))
			mutate(&dl.Spec)
			if err := env.Client.Create(context.Background(), dl); err != nil {
				t.Fatalf("create: %v", err)
			}
			if dl.Spec.TTLSeconds != 30 || dl.Spec.Scope != locksv1alpha1.ScopeNamespace || dl.Spec.Contention != locksv1alpha1.ContentionQueue || dl.Spec.OnLost != locksv1alpha1.OnLostIgnore {
				t.Errorf("defaults: ttlSeconds=%d scope=%q contention=%q onLost=%q; want 30, Namespace, Queue, Ignore",
					dl.Spec.TTLSeconds, dl.Spec.Scope, dl.Spec.Contention, dl.Spec.OnLost)
			}
		})
	}
}

func TestKeysAndScopeAreImmutable(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	dl := validLock("immutable")
	if err := env.Client.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		mutate func(*locksv1alpha1.DistributedLockSpec)
		want   string
	}{
		"keys":  {func(s *locksv1alpha1.DistributedLockSpec) { s.Keys = []string{"other"} }, "spec.keys is immutable"},
		"scope": {func(s *locksv1alpha1.DistributedLockSpec) { s.Scope = locksv1alpha1.ScopeGlobal }, "spec.scope is immutable"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			changed := dl.DeepCopy()
			tc.mutate(&changed.Spec)
			err := env.Client.Update(ctx, changed)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("update = %v, want Invalid with %q", err, tc.want)
			}
		})
	}
}

func TestClusterLockBackendValidation(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	redis := &locksv1alpha1.RedisBackend{Endpoints: []string{"redis.infra:6379"}}
	pg := &locksv1alpha1.PostgresBackend{Host: "pg.infra", Database: "locks", User: "locks"}
	cases := map[string]struct {
		spec locksv1alpha1.ClusterLockBackendSpec
		want []string // empty: accepted
	}{
		"no backend member":     {locksv1alpha1.ClusterLockBackendSpec{NamespaceSelector: &metav1.LabelSelector{}}, []string{"spec", "exactly one store"}},
		"no namespace selector": {locksv1alpha1.ClusterLockBackendSpec{Store: locksv1alpha1.Store{Redis: redis}}, []string{"spec.namespaceSelector", "Required"}},
		"even number of masters": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"a:6379", "b:6379"}}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec.redis", "1 server (standalone) or 3, 5 or 7"}},
		"redis and postgres": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Redis: redis, Postgres: pg},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec", "exactly one store: redis, postgres, zookeeper"}},
		"postgres": {locksv1alpha1.ClusterLockBackendSpec{Store: locksv1alpha1.Store{Postgres: pg}, NamespaceSelector: &metav1.LabelSelector{}}, nil},
		"postgres without a database": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg.infra", User: "locks"}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec.postgres.database", "at least 1 chars long"}},
		"postgres schema with a quote": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg.infra", Database: "locks", User: "locks", Schema: `x"; drop`}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec.postgres.schema"}},
		"zookeeper": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk-0.zk:2181", "zk-1.zk:2181", "zk-2.zk:2181"}}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, nil},
		"zookeeper root not absolute": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk:2181"}, Root: "locks"}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec.zookeeper.root"}},
		"etcd": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd:2379"}}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, nil},
		"etcd username without password": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd:2379"}, Username: "locks"}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"spec.etcd: set username and passwordSecretRef together"}},
		"zookeeper and etcd": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{ZooKeeper: &locksv1alpha1.ZooKeeperBackend{Servers: []string{"zk:2181"}}, Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd:2379"}}},
			NamespaceSelector: &metav1.LabelSelector{},
		}, []string{"exactly one store"}},
		"every namespace, Global for some": {locksv1alpha1.ClusterLockBackendSpec{
			Store:                        locksv1alpha1.Store{Redis: redis},
			NamespaceSelector:            &metav1.LabelSelector{},
			GlobalScopeNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "billing"}},
		}, nil},
		"Global key prefixes": {locksv1alpha1.ClusterLockBackendSpec{
			Store:                        locksv1alpha1.Store{Redis: redis},
			NamespaceSelector:            &metav1.LabelSelector{},
			GlobalScopeNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "billing"}},
			GlobalKeyPrefixes:            []string{"billing/", "shared/billing-"},
		}, nil},
		"an empty Global key prefix": {locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Redis: redis},
			NamespaceSelector: &metav1.LabelSelector{},
			GlobalKeyPrefixes: []string{"billing/", ""},
		}, []string{"spec.globalKeyPrefixes[1]", "at least 1 chars long"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := &locksv1alpha1.ClusterLockBackend{ObjectMeta: metav1.ObjectMeta{GenerateName: "backend-"}, Spec: tc.spec}
			err := env.Client.Create(ctx, b)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("create = %v, want accepted", err)
				}
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v, want Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
