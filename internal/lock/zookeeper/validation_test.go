package zookeeper

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Servers: []string{"zk-0.zk:2181", "10.0.0.2:2181", "[::1]:2181"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string
		want  string
	}{
		{"no servers", Config{}, "servers", "at least one"},
		{"not host:port", Config{Servers: []string{"a:1", "x"}}, "servers[1]", `"x" is not host:port`},
		{"comma list in one entry", Config{Servers: []string{"a:1,b:2"}}, "servers[0]", "not host:port"},
		{"empty host", Config{Servers: []string{":2181"}}, "servers[0]", "not host:port"},
		{"bad port", Config{Servers: []string{"a:http"}}, "servers[0]", "1 to 65535"},
		{"port zero", Config{Servers: []string{"a:0"}}, "servers[0]", "1 to 65535"},
		{"duplicate", Config{Servers: []string{"a:1", "a:1"}}, "servers[1]", "duplicate"},
		{"relative root", Config{Servers: []string{"a:1"}, Root: "locks"}, "root", "absolute"},
		{"root slash", Config{Servers: []string{"a:1"}, Root: "/"}, "root", "root itself"},
		{"trailing slash", Config{Servers: []string{"a:1"}, Root: "/a/"}, "root", "end with"},
		{"double slash", Config{Servers: []string{"a:1"}, Root: "/a//b"}, "root", "empty path element"},
		{"dot", Config{Servers: []string{"a:1"}, Root: "/a/../b"}, "root", `".."`},
		{"reserved", Config{Servers: []string{"a:1"}, Root: "/zookeeper/x"}, "root", "reserves"},
		{"control char", Config{Servers: []string{"a:1"}, Root: "/a\x01"}, "root", "does not allow"},
		{"short session", Config{Servers: []string{"a:1"}, SessionTimeout: time.Millisecond}, "sessionTimeout", "minimum"},
		{"negative clock skew", Config{Servers: []string{"a:1"}, MaxClockSkew: -time.Second}, "maxClockSkew", "outside 0 to"},
		{"huge clock skew", Config{Servers: []string{"a:1"}, MaxClockSkew: time.Hour}, "maxClockSkew", "outside 0 to"},
		{"digest without password", Config{Servers: []string{"a:1"}, Digest: "user"}, "digest", "user:password"},
		{"digest empty user", Config{Servers: []string{"a:1"}, Digest: ":pw"}, "digest", "user:password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			var ce *lock.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want a *lock.ConfigError", err)
			}
			if ce.Field != tc.field || !strings.Contains(ce.Error(), tc.want) {
				t.Fatalf("Validate() = %v (field %q), want field %q and %q in the message", err, ce.Field, tc.field, tc.want)
			}
			if _, err := New(tc.cfg); !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("New accepted the config: %v", err)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	cfg := Config{Servers: []string{"127.0.0.1:1"}}
	for name, opt := range map[string]Option{
		"WithOperationTimeout": WithOperationTimeout(0),
		"WithWaiterTTL":        WithWaiterTTL(time.Millisecond),
		"WithBackoff":          WithBackoff(wait.Backoff{}),
	} {
		_, err := New(cfg, opt)
		var ce *lock.ConfigError
		if !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("New with a bad %s: %v, want a lock.ConfigError naming it", name, err)
		}
	}
}

// validZnodeName mirrors the ZooKeeper server's path rules for one name.
func validZnodeName(n string) bool {
	if n == "" || n == "." || n == ".." || strings.Contains(n, "/") || !utf8.ValidString(n) {
		return false
	}
	for _, r := range n {
		if r <= 0x1f || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || (r >= 0xfff0 && r <= 0xffff) {
			return false
		}
	}
	return true
}

func TestEncodeKey(t *testing.T) {
	for key, want := range map[string]string{
		"ns/team-a/db":  "k-ns%2Fteam-a%2Fdb",
		"global/x.y:z":  "k-global%2Fx.y:z",
		".":             "k-.",
		"..":            "k-..",
		"zookeeper":     "k-zookeeper",
		"100%":          "k-100%25",
		"ü":             "k-%C3%BC",
		"a\x00b":        "k-a%00b",
		"k-%2F":         "k-k-%252F",
		"UPPER_lower09": "k-UPPER_lower09",
	} {
		got := encodeKey(key)
		if got != want {
			t.Errorf("encodeKey(%q) = %q, want %q", key, got, want)
		}
		if !validZnodeName(got) {
			t.Errorf("encodeKey(%q) = %q is not a valid znode name", key, got)
		}
		if back, ok := decodeKey(got); !ok || back != key {
			t.Errorf("decodeKey(%q) = %q, %v; want %q", got, back, ok, key)
		}
	}
	for _, bad := range []string{"holder", "w-1", "k-%2", "k-%zz", "k-%2f", "k-a/b", "k- "} {
		if k, ok := decodeKey(bad); ok {
			t.Errorf("decodeKey(%q) = %q: want it rejected (encodeKey never makes it)", bad, k)
		}
	}
	// Random keys of the operator's shape and of arbitrary bytes: valid
	// names, reversible, and no two keys share a name.
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "abcXYZ019/.:-_%ü\x01"
	seen := map[string]string{}
	for range 20000 {
		var b strings.Builder
		for range 1 + rng.IntN(300) {
			if rng.IntN(10) == 0 {
				b.WriteByte(byte(rng.IntN(256)))
			} else {
				b.WriteByte(alphabet[rng.IntN(len(alphabet))])
			}
		}
		key := b.String()
		name := encodeKey(key)
		if !validZnodeName(name) {
			t.Fatalf("encodeKey(%q) = %q is not a valid znode name", key, name)
		}
		if other, dup := seen[name]; dup && other != key {
			t.Fatalf("keys %q and %q share the name %q", other, key, name)
		}
		seen[name] = key
		if back, ok := decodeKey(name); !ok || back != key {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", key, back, ok)
		}
	}
}

func TestWaiterNames(t *testing.T) {
	h := ownerHash("owner")
	if len(h) != 32 || h == ownerHash("owner2") {
		t.Fatalf("ownerHash = %q: want 32 hex characters, distinct per owner", h)
	}
	a, b := waiterName(5, 9, h), waiterName(5, 10, h)
	if a >= b {
		t.Fatalf("waiter names of one rank do not sort by ticket: %q >= %q", a, b)
	}
	if c := waiterName(4, 11, h); c >= a {
		t.Fatalf("waiter names do not sort by rank: %q >= %q", c, a)
	}
	rank, ticket, hash, ok := parseRanked(b)
	if !ok || rank != 5 || ticket != 10 || hash != h {
		t.Fatalf("parseRanked(%q) = %d, %d, %q, %v", b, rank, ticket, hash, ok)
	}
	// An earlier release's name: its rank is its ticket, so it sorts (as a
	// name too) before every rank in microseconds since 1970.
	legacy := legacyWaiterName(12, h)
	if rank, ticket, hash, ok := parseRanked(legacy); !ok || rank != 12 || ticket != 12 || hash != h {
		t.Fatalf("parseRanked(%q) = %d, %d, %q, %v; want rank and ticket 12", legacy, rank, ticket, hash, ok)
	}
	if now := waiterName(time.Now().UnixMicro()-lock.MaxBoost.Microseconds(), 13, h); legacy >= now {
		t.Fatalf("a legacy waiter's name does not sort before a new one's: %q >= %q", legacy, now)
	}
	for _, bad := range []string{"holder", "w-12-x", "w-abcdefghijklmnopqrs-x", "k-1", waiterName(1, 2, ""), legacyWaiterName(1, "a-b")} {
		if _, _, ok := parseWaiter(bad); ok {
			t.Errorf("parseWaiter(%q) accepted a name that is not a waiter's", bad)
		}
	}
}

func TestValidity(t *testing.T) {
	l, err := New(Config{Servers: []string{"127.0.0.1:1"}, SessionTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if v := l.validity(10 * time.Second); v > 2*time.Second || v < time.Second {
		t.Fatalf("validity(10s) with a 2s session = %v: want just under the session timeout", v)
	}
	if v := l.validity(time.Second); v >= time.Second || v < 900*time.Millisecond {
		t.Fatalf("validity(1s) = %v: want the TTL minus drift", v)
	}
	l.negotiatedMs.Store(500)
	if v := l.validity(time.Second); v >= 500*time.Millisecond {
		t.Fatalf("validity(1s) with a granted 500ms session = %v: want below 500ms", v)
	}
}
