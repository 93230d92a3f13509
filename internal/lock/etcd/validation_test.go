package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string // "" = valid
		hint  string // part of the reason
	}{
		{name: "one endpoint", cfg: Config{Endpoints: []string{"127.0.0.1:2379"}}},
		{name: "three endpoints, prefix, auth", cfg: Config{Endpoints: []string{"a:2379", "b:2379", "[::1]:2379"}, Prefix: "/team-a/", Username: "u", Password: "p"}},
		{name: "no endpoints", cfg: Config{}, field: "endpoints", hint: "at least one"},
		{name: "not host:port", cfg: Config{Endpoints: []string{"a:2379", "x"}}, field: "endpoints[1]", hint: `"x" is not host:port`},
		{name: "scheme", cfg: Config{Endpoints: []string{"https://a:2379"}}, field: "endpoints[0]", hint: "scheme"},
		{name: "empty host", cfg: Config{Endpoints: []string{":2379"}}, field: "endpoints[0]", hint: "host:port"},
		{name: "bad port", cfg: Config{Endpoints: []string{"a:http"}}, field: "endpoints[0]", hint: "1-65535"},
		{name: "port zero", cfg: Config{Endpoints: []string{"a:0"}}, field: "endpoints[0]", hint: "1-65535"},
		{name: "duplicate", cfg: Config{Endpoints: []string{"a:1", "a:1"}}, field: "endpoints[1]", hint: "duplicate"},
		{name: "prefix without slash", cfg: Config{Endpoints: []string{"a:1"}, Prefix: "/x"}, field: "prefix", hint: `"/x/"`},
		{name: "prefix with space", cfg: Config{Endpoints: []string{"a:1"}, Prefix: "/x y/"}, field: "prefix", hint: "whitespace"},
		{name: "user without password", cfg: Config{Endpoints: []string{"a:1"}, Username: "u"}, field: "username", hint: "both"},
		{name: "password without user", cfg: Config{Endpoints: []string{"a:1"}, Password: "p"}, field: "username", hint: "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *lock.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want a *lock.ConfigError matching lock.ErrInvalidConfig", err)
			}
			if ce.Field != tc.field || !strings.Contains(ce.Reason, tc.hint) {
				t.Fatalf("Validate() = %v, want field %q and a reason mentioning %q", err, tc.field, tc.hint)
			}
			if _, err := New(tc.cfg); !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("New() = %v, want the validation error", err)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	cfg := Config{Endpoints: []string{"127.0.0.1:1"}}
	for name, opt := range map[string]Option{
		"WithOpTimeout":   WithOpTimeout(0),
		"WithDialTimeout": WithDialTimeout(-time.Second),
		"WithWaiterTTL":   WithWaiterTTL(time.Millisecond),
		"WithBackoff":     WithBackoff(wait.Backoff{}),
	} {
		var ce *lock.ConfigError
		if _, err := New(cfg, opt); !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("New with a bad %s: %v, want a lock.ConfigError naming it", name, err)
		}
	}
	// With auth too: clientv3.New would authenticate, so the client is made
	// on first use and New does no network I/O.
	cfg.Username, cfg.Password = "root", "secret"
	l, err := New(cfg, WithWaiterTTL(time.Second), WithDialTimeout(100*time.Millisecond), WithOpTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("New without I/O must succeed even when nothing listens: %v", err)
	}
	if err := l.Ping(context.Background()); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("Ping with nothing listening = %v, want ErrBackendUnavailable", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(context.Background(), lock.Request{Keys: []string{"k"}, TTL: time.Second}); !errors.Is(err, lock.ErrBackendUnavailable) {
		t.Fatalf("TryAcquire after Close = %v, want ErrBackendUnavailable", err)
	}
}

func TestEscapeKey(t *testing.T) {
	keys := []string{
		"a", "a/b", "a%2Fb", "ns/default/db-migration", "global/x.y:z", "a/", "/a", "%", "%25",
		"ümlaut", "a\x00b", "a b", strings.Repeat("k/", 150), "A_b-c.d:e",
	}
	seen := map[string]string{}
	for _, k := range keys {
		e := escapeKey(k)
		if strings.Contains(e, "/") {
			t.Errorf("escapeKey(%q) = %q contains '/': a key's queue prefix could cover another key's", k, e)
		}
		if strings.ContainsAny(e, " \t\r\n\x00") {
			t.Errorf("escapeKey(%q) = %q contains whitespace or NUL", k, e)
		}
		if other, dup := seen[e]; dup {
			t.Errorf("escapeKey(%q) = escapeKey(%q) = %q: keys collide", k, other, e)
		}
		seen[e] = k
		back, err := unescapeKey(e)
		if err != nil || back != k {
			t.Errorf("unescapeKey(escapeKey(%q)) = %q, %v", k, back, err)
		}
	}
	if got := escapeKey("ns/default/db-migration"); got != "ns%2Fdefault%2Fdb-migration" {
		t.Errorf("escapeKey keeps readable keys readable: got %q", got)
	}
	for _, bad := range []string{"%", "%4", "%zz"} {
		if _, err := unescapeKey(bad); err == nil {
			t.Errorf("unescapeKey(%q) succeeded, want an error", bad)
		}
	}
}

// TestKeyLayoutNoPrefixOverlap: no key's queue range contains another key's
// waiter keys, and holder keys of different keys never nest.
func TestKeyLayoutNoPrefixOverlap(t *testing.T) {
	l := &Locker{prefix: DefaultPrefix}
	keys := []string{"a", "a/b", "a.b", "ab", "a-"}
	for _, k := range keys {
		for _, o := range keys {
			if k == o {
				continue
			}
			if strings.HasPrefix(l.waiterKey(o, ownerTag("x")), l.queuePrefix(k)) {
				t.Errorf("queue of %q covers a waiter of %q", k, o)
			}
			if strings.HasPrefix(l.holderKey(o), l.holderKey(k)+"/") {
				t.Errorf("holder key of %q nests under %q", o, k)
			}
		}
	}
}

// TestOwnerRange checks the value range the owner comparisons use: exactly
// the values that start with the tag and a space.
func TestOwnerRange(t *testing.T) {
	tag := ownerTag("owner-1")
	other := ownerTag("owner-2")
	in := func(v string) bool { return v > tag+" " && v < tag+"!" }
	if !in(encodeValue(tag, holderRecord{Holder: "h"})) {
		t.Error("the owner's own value is outside its range")
	}
	for _, v := range []string{encodeValue(other, holderRecord{}), tag, tag + " ", tag + "!", tag[:31], "", tag + "0 {}"} {
		if in(v) {
			t.Errorf("value %q is inside the range of owner tag %q", v, tag)
		}
	}
	if len(tag) != 32 || strings.Contains(tag, "owner") {
		t.Errorf("ownerTag = %q: want 32 hex digits that do not reveal the token", tag)
	}
}

func TestTTLSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		100 * time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, 10 * time.Second: 10, 90 * time.Second: 90,
	} {
		if got := ttlSeconds(d); got != want {
			t.Errorf("ttlSeconds(%v) = %d, want %d (never below the TTL)", d, got, want)
		}
	}
}
