package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

func validConfig() Config {
	return Config{Host: "postgres.db.svc", Database: "locks", User: "lockwarden"}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		field  string // empty: valid
		reason string // a substring of the reason
	}{
		{"minimal", func(*Config) {}, "", ""},
		{"ipv4", func(c *Config) { c.Host = "10.0.0.5" }, "", ""},
		{"ipv6", func(c *Config) { c.Host = "::1" }, "", ""},
		{"all set", func(c *Config) {
			c.Port, c.Password, c.Schema = 6543, "pw", "locks_2"
		}, "", ""},
		{"no host", func(c *Config) { c.Host = "" }, "host", "required"},
		{"unix socket", func(c *Config) { c.Host = "/var/run/postgresql" }, "host", "Unix socket"},
		{"host list", func(c *Config) { c.Host = "a,b" }, "host", "several hosts"},
		{"host with port", func(c *Config) { c.Host = "db:5432" }, "host", "includes a port"},
		{"bracketed ipv6", func(c *Config) { c.Host = "[::1]" }, "host", "neither an IP address nor a DNS name"},
		{"host with space", func(c *Config) { c.Host = "db host" }, "host", "neither"},
		{"host with query", func(c *Config) { c.Host = "db?sslmode=disable" }, "host", "neither"},
		{"negative port", func(c *Config) { c.Port = -1 }, "port", "1 to 65535"},
		{"big port", func(c *Config) { c.Port = 70000 }, "port", "1 to 65535"},
		{"no database", func(c *Config) { c.Database = "" }, "database", "required"},
		{"no user", func(c *Config) { c.User = "" }, "user", "required"},
		{"nul in password", func(c *Config) { c.Password = "a\x00b" }, "password", "NUL"},
		{"schema upper case", func(c *Config) { c.Schema = "Locks" }, "schema", "plain identifier"},
		{"schema quote", func(c *Config) { c.Schema = `a"b` }, "schema", "plain identifier"},
		{"schema injection", func(c *Config) { c.Schema = "x; DROP TABLE y" }, "schema", "plain identifier"},
		{"schema digit first", func(c *Config) { c.Schema = "1locks" }, "schema", "plain identifier"},
		{"schema pg_", func(c *Config) { c.Schema = "pg_locks" }, "schema", "reserves"},
		{"schema too long", func(c *Config) { c.Schema = strings.Repeat("a", MaxSchemaLen+1) }, "schema", "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", c, err)
				}
				return
			}
			var ce *lock.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("Validate(%+v) = %v, want a *lock.ConfigError matching lock.ErrInvalidConfig", c, err)
			}
			if ce.Field != tc.field || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("error %q: want field %q and a reason containing %q", err, tc.field, tc.reason)
			}
			if _, err := New(c); !errors.Is(err, lock.ErrInvalidConfig) {
				t.Fatalf("New with an invalid config: %v, want lock.ErrInvalidConfig", err)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for name, opt := range map[string]Option{
		"WithOperationTimeout": WithOperationTimeout(0),
		"WithWaiterTTL":        WithWaiterTTL(time.Millisecond),
		"WithMaxConns":         WithMaxConns(0),
	} {
		_, err := New(validConfig(), opt)
		var ce *lock.ConfigError
		if !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("New with a bad %s: %v, want a *lock.ConfigError naming it", name, err)
		}
	}
}

// TestNewDoesNoIO: New contacts nothing, Close is fine without any use, and
// an unreachable server fails operations with ErrBackendUnavailable naming
// the endpoint.
func TestNewDoesNoIO(t *testing.T) {
	dials := 0
	cfg := validConfig()
	cfg.Dial = func(context.Context, string, string) (net.Conn, error) {
		dials++
		return nil, errors.New("refused by test")
	}
	l, err := New(cfg, WithOperationTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if dials != 0 {
		t.Fatalf("New dialed %d times, want 0", dials)
	}
	err = l.Ping(context.Background())
	var ne *lock.NodeError
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.As(err, &ne) || ne.Node != "postgres.db.svc:5432" {
		t.Fatalf("Ping through a refusing dialer: %v, want ErrBackendUnavailable naming postgres.db.svc:5432", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestInvalidInputNoIO: requests the database would refuse (NUL bytes,
// invalid UTF-8, oversized keys) fail as invalid before any I/O, never panic.
func TestInvalidInputNoIO(t *testing.T) {
	cfg := validConfig()
	cfg.Dial = func(context.Context, string, string) (net.Conn, error) {
		t.Error("dialed for an invalid request")
		return nil, errors.New("no")
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	long := strings.Repeat("k", MaxKeyBytes+1)
	reqs := map[string]lock.Request{
		"nul owner":      {Keys: []string{"a"}, TTL: time.Second, Owner: "a\x00"},
		"invalid holder": {Keys: []string{"a"}, TTL: time.Second, Holder: "\xff"},
		"long key":       {Keys: []string{long}, TTL: time.Second},
		"queue no owner": {Keys: []string{"a"}, TTL: time.Second, Queue: true},
	}
	for name, r := range reqs {
		if _, err := l.TryAcquire(ctx, r); !errors.Is(err, lock.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if _, err := l.Inspect(ctx, []string{long}); !errors.Is(err, lock.ErrInvalidRequest) {
		t.Errorf("Inspect of a long key: %v", err)
	}
	if err := l.Release(ctx, &lock.Lease{Keys: []string{"a"}, Owner: "\x00"}); !errors.Is(err, lock.ErrInvalidRequest) {
		t.Errorf("Release with a NUL owner: %v", err)
	}
	if _, err := l.Watch(ctx, long); !errors.Is(err, lock.ErrInvalidRequest) {
		t.Errorf("Watch of a long key: %v", err)
	}
}

// TestKeyEncoding: keys are stored as their exact bytes and notified
// hex-encoded, so any two different keys stay different, whatever bytes they
// contain, and the payload decodes back to the key.
func TestKeyEncoding(t *testing.T) {
	keys := []string{
		"ns/default/db-migration", "global/db-migration", "ns/default/db.migration",
		"a:b", "a-b", "a/b", "A/b", "\xff\xfe", "ключ", "a\x00b", "a",
		strings.Repeat("x", 300),
	}
	enc := encodeKeys(keys)
	seen := map[string]string{}
	for i, k := range keys {
		if string(enc[i]) != k {
			t.Fatalf("encodeKeys(%q) = %q: want the key's bytes", k, enc[i])
		}
		if other, dup := seen[string(enc[i])]; dup {
			t.Fatalf("keys %q and %q encode the same", k, other)
		}
		seen[string(enc[i])] = k
		got, err := decodePayload(hexOf(enc[i]))
		if err != nil || got != k {
			t.Fatalf("decodePayload(hex(%q)) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "zz", "abc", hexOf([]byte(strings.Repeat("k", MaxKeyBytes+1)))} {
		if _, err := decodePayload(bad); err == nil {
			t.Errorf("decodePayload(%q): want an error", bad)
		}
	}
}

// hexOf is what the SQL functions send: encode(key, 'hex').
func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestMigrationsEmbedded: the migrations are numbered 1, 2, ... and render
// with the schema quoted and the channel as a literal, nothing left over.
func TestMigrationsEmbedded(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || LatestSchemaVersion() != len(ms) {
		t.Fatalf("%d migrations, latest version %d", len(ms), LatestSchemaVersion())
	}
	sql := render(ms[0].sql, "locks_x", "locks_x_released")
	if strings.Contains(sql, "{{") || !strings.Contains(sql, `"locks_x".locks`) || !strings.Contains(sql, `'locks_x_released'`) {
		t.Fatalf("rendered migration has placeholders left or misses the schema/channel")
	}
}

// TestConnConfigIgnoresEnvironment: the pgx configuration comes from Config
// alone; PG* environment variables (which pgx's defaults read) change nothing.
func TestConnConfigIgnoresEnvironment(t *testing.T) {
	for k, v := range map[string]string{
		"PGHOST": "evil.example", "PGPORT": "1", "PGDATABASE": "evil", "PGUSER": "evil",
		"PGPASSWORD": "evil", "PGOPTIONS": "-c search_path=evil", "PGAPPNAME": "evil",
		"PGSSLMODE": "disable", "PGTARGETSESSIONATTRS": "read-write",
	} {
		t.Setenv(k, v)
	}
	cfg := validConfig()
	cfg.Password = "pw"
	cc, err := connConfig(cfg, options{opTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if cc.Host != cfg.Host || cc.Port != DefaultPort || cc.Database != cfg.Database || cc.User != cfg.User || cc.Password != "pw" {
		t.Fatalf("connection target %s:%d/%s as %s: want the Config's", cc.Host, cc.Port, cc.Database, cc.User)
	}
	if len(cc.Fallbacks) != 0 || cc.TLSConfig != nil || cc.ValidateConnect != nil {
		t.Fatalf("fallbacks %v, TLS %v, validate %v: want none (no TLS in Config)", cc.Fallbacks, cc.TLSConfig, cc.ValidateConnect != nil)
	}
	if len(cc.RuntimeParams) != 1 || cc.RuntimeParams["application_name"] != "lockwarden" {
		t.Fatalf("runtime parameters %v: want only application_name", cc.RuntimeParams)
	}
	addrs, err := cc.LookupFunc(context.Background(), cfg.Host)
	if err != nil || len(addrs) != 1 || addrs[0] != cfg.Host {
		t.Fatalf("lookup = %v, %v: want the host as written", addrs, err)
	}
}

// TestPoolConfigIgnoresEnvironment: the pool settings come from the options
// alone, even when a service file named by the environment sets pool_*
// parameters (which pgxpool.ParseConfig reads) and connection parameters.
func TestPoolConfigIgnoresEnvironment(t *testing.T) {
	svc := filepath.Join(t.TempDir(), "pg_service.conf")
	if err := os.WriteFile(svc, []byte("[evil]\nhost=evil.example\ndbname=evil\npool_max_conns=99\npool_min_conns=5\npool_min_idle_conns=5\npool_max_conn_idle_time=1h\npool_health_check_period=1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGSERVICEFILE", svc)
	t.Setenv("PGSERVICE", "evil")
	t.Setenv("PGHOST", "evil.example")
	cfg := validConfig()
	o := options{opTimeout: time.Second, maxConns: 3}
	cc, err := connConfig(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := poolConfig(cc, o)
	if err != nil {
		t.Fatal(err)
	}
	if pc.ConnConfig != cc || pc.ConnConfig.Host != cfg.Host || pc.ConnConfig.Database != cfg.Database {
		t.Fatalf("pool connects to %s/%s: want the Config's connection configuration", pc.ConnConfig.Host, pc.ConnConfig.Database)
	}
	if pc.MaxConns != 3 || pc.MinConns != 0 || pc.MinIdleConns != 0 || pc.MaxConnIdleTime != maxIdle || pc.HealthCheckPeriod != healthCheckPeriod {
		t.Fatalf("pool max %d, min %d, min idle %d, idle time %v, health check %v: want the options' and the package's",
			pc.MaxConns, pc.MinConns, pc.MinIdleConns, pc.MaxConnIdleTime, pc.HealthCheckPeriod)
	}
	if pc.BeforeConnect != nil || pc.AfterConnect != nil || pc.PrepareConn != nil || pc.AfterRelease != nil {
		t.Fatal("pool hooks set: want none")
	}
	for k := range pc.ConnConfig.RuntimeParams {
		if k != "application_name" {
			t.Fatalf("runtime parameter %q from the environment", k)
		}
	}
}

// TestConnConfigTLS: with TLS set, TLS is required (no plain fallback) and
// the certificate is checked against Host unless ServerName says otherwise.
func TestConnConfigTLS(t *testing.T) {
	cfg := validConfig()
	cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
	cc, err := connConfig(cfg, options{opTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if cc.TLSConfig == nil || cc.TLSConfig.ServerName != cfg.Host || cc.TLSConfig.InsecureSkipVerify || len(cc.Fallbacks) != 0 {
		t.Fatalf("TLS %+v, fallbacks %v: want verify-full against %s and no fallback", cc.TLSConfig, cc.Fallbacks, cfg.Host)
	}
	if cfg.TLS.ServerName != "" {
		t.Fatal("the caller's tls.Config was modified")
	}
}
