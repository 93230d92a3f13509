package backend

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// heapInUse returns the bytes of the heap in use after a full collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// heapGrowth returns how much more heap is in use after read than before it.
// The Secrets live in the fake API server throughout, so only what the
// registry keeps counts.
func heapGrowth(t *testing.T, read func()) int64 {
	t.Helper()
	before := heapInUse()
	read()
	grown := heapInUse() - before
	t.Logf("heap in use grew by %d MiB", grown>>20)
	return grown
}

// TestTheSecretCacheKeepsOnlyTheReferencedKey: a tenant points a lock's
// passwordSecretRef (a mutable field) at one large Secret after another. The
// operator keeps the password it needs from each, not the rest of the
// Secret: the tenant cannot make it hold their Secrets' bytes.
func TestTheSecretCacheKeepsOnlyTheReferencedKey(t *testing.T) {
	const n, padding = 120, 1 << 20
	objs := make([]client.Object, 0, n)
	for i := range n {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: fmt.Sprintf("s%03d", i)},
			Data: map[string][]byte{"password": fmt.Appendf(nil, "password-%03d", i), "padding": make([]byte, padding)}})
	}
	r := registryWith(t, objs...)
	dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}})
	grown := heapGrowth(t, func() {
		for i := range n {
			dl.Spec.Backend.Redis.PasswordSecretRef = &locksv1alpha1.SecretKeyRef{Name: fmt.Sprintf("s%03d", i), Key: "password"}
			cfg, _, _, err := r.resolveLock(t.Context(), dl)
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("password-%03d", i); cfg.Password != want {
				t.Fatalf("password %q, want %q", cfg.Password, want)
			}
		}
	})
	if grown > 32<<20 {
		t.Errorf("after reading %d Secrets of %d MiB for their %d-byte passwords, the operator holds %d MiB more", n, padding>>20, len("password-000"), grown>>20)
	}
	runtime.KeepAlive(r)
}

// TestTheSecretCacheIsBoundedInBytes: values the operator does need (CA
// bundles just under their limit) from many Secrets are kept up to
// maxCachedSecretBytes in all, not one per Secret.
func TestTheSecretCacheIsBoundedInBytes(t *testing.T) {
	const n = 250
	ca := newCA(t, "ca")
	bundle := append(bytes.Repeat([]byte("# padding\n"), (maxCABundleBytes-len(ca)-1)/10), ca...)
	objs := make([]client.Object, 0, n)
	for i := range n {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: fmt.Sprintf("ca%03d", i)},
			Data: map[string][]byte{"ca.crt": bundle}})
	}
	r := registryWith(t, objs...)
	dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, TLS: &locksv1alpha1.BackendTLS{}})
	grown := heapGrowth(t, func() {
		for i := range n {
			dl.Spec.Backend.Redis.TLS.CASecretRef = &locksv1alpha1.SecretKeyRef{Name: fmt.Sprintf("ca%03d", i), Key: "ca.crt"}
			cfg, _, _, err := r.resolveLock(t.Context(), dl)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.TLS == nil || cfg.TLS.RootCAs == nil {
				t.Fatal("no CA pool built from the bundle")
			}
		}
	})
	if grown > 2*maxCachedSecretBytes {
		t.Errorf("after reading %d CA bundles of %d KiB, the operator holds %d MiB more; the cache may hold %d MiB",
			n, len(bundle)>>10, grown>>20, maxCachedSecretBytes>>20)
	}
	runtime.KeepAlive(r)
}

// TestSecretChangesArePickedUpAfterTheTTL: a Secret read is reused for the
// TTL (many locks, one read), and a change to it (a rotated password, a
// value made small enough) is used once the TTL has passed.
func TestSecretChangesArePickedUpAfterTheTTL(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).
		WithObjects(secret("team-a", "redis-auth", map[string]string{"password": "s3cret"})).Build()
	reader := &countingReader{Reader: c}
	r := NewRegistry(t.Context(), reader, nil, logr.Discard())
	r.SetSecretTTL(time.Hour)
	dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"}})
	password := func() (string, error) {
		t.Helper()
		cfg, _, _, err := r.resolveLock(t.Context(), dl)
		return cfg.Password, err
	}
	update := func(v string) {
		t.Helper()
		var s corev1.Secret
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: "redis-auth"}, &s); err != nil {
			t.Fatal(err)
		}
		s.Data["password"] = []byte(v)
		if err := c.Update(t.Context(), &s); err != nil {
			t.Fatal(err)
		}
	}

	for range 3 {
		if got, err := password(); err != nil || got != "s3cret" {
			t.Fatalf("password = %q, %v; want s3cret", got, err)
		}
	}
	if got := reader.gets.Load(); got != 1 {
		t.Errorf("the Secret was read %d times for 3 resolves within the TTL, want 1", got)
	}
	update("rotated")
	if got, _ := password(); got != "s3cret" {
		t.Errorf("password = %q within the TTL of the first read, want the cached s3cret", got)
	}

	r.SetSecretTTL(0)
	if got, err := password(); err != nil || got != "rotated" {
		t.Fatalf("password = %q, %v after the TTL; want rotated", got, err)
	}
	update(string(make([]byte, maxCredentialBytes+1)))
	if _, err := password(); err == nil {
		t.Fatal("a password over the limit was accepted")
	}
	update("s3cret")
	if got, err := password(); err != nil || got != "s3cret" {
		t.Fatalf("password = %q, %v once the Secret holds a short one again; want s3cret", got, err)
	}
}

// What a tenant writes into a name or a credential reaches the store as it
// is, before the operator has seen a byte of what the server is: a CR/LF in
// a Redis password sent to an HTTP server on an allowed host:port would be
// a request of its own. Control bytes are refused, naming the field, and an
// empty password is an error, not "no AUTH".
func TestNamesAndCredentialsMustBePrintable(t *testing.T) {
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "creds"}, Data: map[string][]byte{
			"good":    []byte("s3cr3t with spaces"),
			"crlf":    []byte("x\r\nGET / HTTP/1.1\r\nHost: evil\r\n\r\n"),
			"newline": []byte("s3cr3t\n"),
			"empty":   {},
			"utf8":    []byte("pässwörd"),
			"nul":     {'a', 0, 'b'},
			"del":     {'a', 0x7f},
		}},
	}
	r := registryWith(t, objs...)
	for _, tc := range []struct {
		key, want string // want: "" when accepted
	}{
		{"good", ""},
		{"utf8", ""},
		{"crlf", `key "crlf" holds a control character at byte 1`},
		{"newline", `key "newline" holds a control character at byte 6`},
		{"nul", "control character at byte 1"},
		{"del", "control character at byte 1"},
		{"empty", `key "empty" is empty; a password must not be empty (to connect without one, remove the reference)`},
	} {
		dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}, PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "creds", Key: tc.key}})
		_, _, _, err := r.resolveLock(t.Context(), dl)
		var se *SecretError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("password %q: %v; want it accepted", tc.key, err)
		case tc.want != "" && (!errors.As(err, &se) || se.Field != "spec.backend.redis.passwordSecretRef" || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("password %q: %v; want a SecretError on spec.backend.redis.passwordSecretRef saying %q", tc.key, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "GET /"):
			t.Errorf("password %q: the error %q shows the Secret's value", tc.key, err)
		}
	}

	for _, tc := range []struct {
		name  string
		spec  Spec
		field string
	}{
		{"a Sentinel master name", Spec{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"s:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "main\r\nFLUSHALL"}}}, "spec.redis.sentinel.masterName"},
		{"a PostgreSQL user", Spec{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg", Database: "locks", User: "lock\x00er"}}, "spec.postgres.user"},
		{"a PostgreSQL database", Spec{Postgres: &locksv1alpha1.PostgresBackend{Host: "pg", Database: "locks\n", User: "locker"}}, "spec.postgres.database"},
		{"an etcd user", Spec{Etcd: &locksv1alpha1.EtcdBackend{Endpoints: []string{"etcd:2379"}, Username: "root\r", PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "creds", Key: "good"}}}, "spec.etcd.username"},
	} {
		err := tc.spec.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+": byte ") || !strings.Contains(err.Error(), "must be printable") {
			t.Errorf("%s with a control byte: Validate = %v; want an error naming %s", tc.name, err, tc.field)
		}
	}
	inline := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{"s:26379"}, Sentinel: &locksv1alpha1.RedisSentinel{MasterName: "main\r\nFLUSHALL"}})
	var pe *PolicyError
	if err := r.Check(t.Context(), inline); !errors.As(err, &pe) || !strings.Contains(pe.Message, "spec.backend.redis.sentinel.masterName: byte 4") {
		t.Errorf("an inline Sentinel master name with CR/LF: Check = %v; want a refusal naming spec.backend.redis.sentinel.masterName", err)
	}
}
