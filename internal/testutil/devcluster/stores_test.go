package devcluster

import (
	"strings"
	"testing"
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
	if _, _, err := StoreClusterLockBackend("x", &Store{Kind: "mysql", Addrs: []string{"a:1"}}); err == nil {
		t.Error("a mysql store gave a backend")
	}
}
