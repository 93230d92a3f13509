package devcluster

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/etcdtest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

func TestValidateStore(t *testing.T) {
	for _, ok := range append([]string{""}, StoreKinds...) {
		if err := ValidateStore(ok); err != nil {
			t.Errorf("ValidateStore(%q) = %v", ok, err)
		}
	}
	err := ValidateStore("mysql")
	if err == nil || !strings.Contains(err.Error(), "redis, postgres, zookeeper, etcd") {
		t.Errorf("ValidateStore(mysql) = %v, want an error listing the valid stores", err)
	}
}

func TestStoreClusterLockBackend(t *testing.T) {
	pg := &Store{Kind: StorePostgres, Addrs: []string{"127.0.0.1:5433"}, Database: "lockwarden", User: "locker", Password: "pw"}
	b, secret, err := StoreClusterLockBackend(DevBackend, pg)
	if err != nil {
		t.Fatal(err)
	}
	p := b.Spec.Postgres
	if b.Name != DevBackend || p == nil || p.Host != "127.0.0.1" || p.Port != 5433 || p.Database != "lockwarden" || p.User != "locker" ||
		p.PasswordSecretRef == nil || p.PasswordSecretRef.Name != "dev-password" || p.PasswordSecretRef.Key != "password" {
		t.Fatalf("postgres backend = %+v", b.Spec)
	}
	if b.Spec.NamespaceSelector == nil || len(b.Spec.NamespaceSelector.MatchLabels)+len(b.Spec.NamespaceSelector.MatchExpressions) != 0 {
		t.Errorf("namespaceSelector = %v, want {}", b.Spec.NamespaceSelector)
	}
	if secret == nil || secret.Namespace != OperatorNamespace || secret.Name != "dev-password" || string(secret.Data["password"]) != "pw" {
		t.Errorf("secret = %+v", secret)
	}

	for _, s := range []*Store{
		{Kind: StoreRedis, Addrs: []string{"127.0.0.1:6379"}},
		{Kind: StoreZooKeeper, Addrs: []string{"127.0.0.1:2181"}},
		{Kind: StoreEtcd, Addrs: []string{"127.0.0.1:2379"}},
	} {
		b, secret, err := StoreClusterLockBackend("x", s)
		if err != nil || secret != nil {
			t.Fatalf("%s: %v, secret %v", s.Kind, err, secret)
		}
		set := 0
		if b.Spec.Redis != nil && b.Spec.Redis.Endpoints[0] == s.Addrs[0] {
			set++
		}
		if b.Spec.ZooKeeper != nil && b.Spec.ZooKeeper.Servers[0] == s.Addrs[0] {
			set++
		}
		if b.Spec.Etcd != nil && b.Spec.Etcd.Endpoints[0] == s.Addrs[0] {
			set++
		}
		if set != 1 || b.Spec.Postgres != nil {
			t.Errorf("%s: spec %+v, want exactly the %s member naming %s", s.Kind, b.Spec, s.Kind, s.Addrs[0])
		}
	}
	if b, secret, err := StoreClusterLockBackend("x", &Store{Kind: StoreKubernetes}); err != nil || secret != nil || b.Spec.Kubernetes == nil ||
		b.Spec.Redis != nil || b.Spec.Postgres != nil || b.Spec.ZooKeeper != nil || b.Spec.Etcd != nil {
		t.Errorf("kubernetes: %+v, secret %v, %v; want only spec.kubernetes", b, secret, err)
	}
	if _, _, err := StoreClusterLockBackend("x", &Store{Kind: "mysql", Addrs: []string{"a:1"}}); err == nil {
		t.Error("a mysql store gave a backend")
	}
}

// TestStartStore starts each store as `make dev BACKEND=...` does, without a
// control plane, and checks that it answers on its address and that Stop
// ends it. Skipped with -short, and per store when its server is missing.
func TestStartStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, ZooKeeper and etcd servers; skipped with -short")
	}
	for _, kind := range []string{StorePostgres, StoreZooKeeper, StoreEtcd} {
		t.Run(kind, func(t *testing.T) {
			var missing error
			assets := ""
			switch kind {
			case StorePostgres:
				_, missing = pgtest.BinDir()
			case StoreZooKeeper:
				_, _, missing = zktest.Runtime()
			case StoreEtcd:
				var bin string
				bin, missing = etcdtest.Binary()
				assets = filepath.Dir(bin)
			}
			if missing != nil {
				t.Skipf("%s missing: %v", kind, missing)
			}
			dir := t.TempDir()
			c := &Cluster{Dir: dir, Assets: assets, logDir: filepath.Join(dir, "logs"), httpClient: &http.Client{Timeout: 5 * time.Second},
				opts: Options{Logf: t.Logf}}
			if err := os.MkdirAll(c.logDir, 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Stop)
			s, err := c.StartStore(t.Context(), kind)
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != kind || len(s.Addrs) != 1 || len(s.LogPaths) != 1 {
				t.Fatalf("store = %+v", s)
			}
			if _, err := os.Stat(s.LogPaths[0]); err != nil {
				t.Errorf("log: %v", err)
			}
			if kind == StorePostgres && (s.Password == "" || s.User == "" || s.Database == "") {
				t.Errorf("postgres credentials: %+v", s)
			}
			conn, err := net.DialTimeout("tcp", s.Addrs[0], 2*time.Second)
			if err != nil {
				t.Fatalf("dial %s: %v", s.Addrs[0], err)
			}
			_ = conn.Close()
			c.Stop() // stops the stores it started
			if conn, err := net.DialTimeout("tcp", s.Addrs[0], 2*time.Second); err == nil {
				_ = conn.Close()
				t.Errorf("%s still answers on %s after Stop", kind, s.Addrs[0])
			}
		})
	}
}
