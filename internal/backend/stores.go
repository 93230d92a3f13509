package backend

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	etcdlock "github.com/lockwarden/lockwarden/internal/lock/etcd"
	pglock "github.com/lockwarden/lockwarden/internal/lock/postgres"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	zklock "github.com/lockwarden/lockwarden/internal/lock/zookeeper"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// Spec is the store a backend names: exactly one member is set (the API's
// CEL rules see to that; Check refuses anything else).
type Spec struct {
	Redis     *locksv1alpha1.RedisBackend
	Postgres  *locksv1alpha1.PostgresBackend
	ZooKeeper *locksv1alpha1.ZooKeeperBackend
	Etcd      *locksv1alpha1.EtcdBackend
}

// ClusterSpec is the store a ClusterLockBackend names.
func ClusterSpec(b *locksv1alpha1.ClusterLockBackend) Spec {
	return Spec{Redis: b.Spec.Redis, Postgres: b.Spec.Postgres, ZooKeeper: b.Spec.ZooKeeper, Etcd: b.Spec.Etcd}
}

// NamespacedSpec is the store a LockBackend names.
func NamespacedSpec(b *locksv1alpha1.LockBackend) Spec {
	return Spec{Redis: b.Spec.Redis, Postgres: b.Spec.Postgres, ZooKeeper: b.Spec.ZooKeeper, Etcd: b.Spec.Etcd}
}

// Store types, as status.type shows them.
const (
	TypeRedis     = "Redis"
	TypePostgres  = "PostgreSQL"
	TypeZooKeeper = "ZooKeeper"
	TypeEtcd      = "etcd"
)

// members lists the set members' field names and types, in API order.
func (s Spec) members() (fields, types []string) {
	add := func(set bool, field, typ string) {
		if set {
			fields, types = append(fields, field), append(types, typ)
		}
	}
	add(s.Redis != nil, "redis", TypeRedis)
	add(s.Postgres != nil, "postgres", TypePostgres)
	add(s.ZooKeeper != nil, "zookeeper", TypeZooKeeper)
	add(s.Etcd != nil, "etcd", TypeEtcd)
	return fields, types
}

// Validate says why the spec names no single store (nil: it names one).
func (s Spec) Validate() error {
	fields, _ := s.members()
	switch len(fields) {
	case 1:
	case 0:
		return fmt.Errorf("spec sets no backend member: set one of redis, postgres, zookeeper or etcd")
	default:
		return fmt.Errorf("spec sets %s: set exactly one backend member", strings.Join(fields, " and "))
	}
	if e := s.Etcd; e != nil && (e.Username == "") != (e.PasswordSecretRef == nil) {
		return fmt.Errorf("spec.etcd: set username and passwordSecretRef together")
	}
	// Names the store receives verbatim, before the operator has seen a
	// byte of what the server is: control bytes (CR, LF) would let them
	// form requests of another, line-based protocol.
	var names [][2]string
	if r := s.Redis; r != nil && r.Sentinel != nil {
		names = append(names, [2]string{"spec.redis.sentinel.masterName", r.Sentinel.MasterName})
	}
	if r := s.Redis; r != nil {
		names = append(names, [2]string{"spec.redis.username", r.Username})
	}
	if p := s.Postgres; p != nil {
		names = append(names, [2]string{"spec.postgres.user", p.User}, [2]string{"spec.postgres.database", p.Database})
	}
	if e := s.Etcd; e != nil {
		names = append(names, [2]string{"spec.etcd.username", e.Username})
	}
	for _, n := range names {
		if i := controlByte(n[1]); i >= 0 {
			return fmt.Errorf("%s: byte %d is a control character (below 0x20, or 0x7f); the name is sent to the store as it is, so it must be printable", n[0], i)
		}
	}
	return nil
}

// Field is the spec field of the set member ("redis", "postgres", ...).
func (s Spec) Field() string {
	fields, _ := s.members()
	if len(fields) != 1 {
		return ""
	}
	return fields[0]
}

// Type is the kind of store the spec names (TypeRedis, ...), "" when not exactly one.
func (s Spec) Type() string {
	_, types := s.members()
	if len(types) != 1 {
		return ""
	}
	return types[0]
}

// endpointField is what one of Endpoints is called in errors.
func (s Spec) endpointField(i int) string {
	switch {
	case s.Postgres != nil:
		return "host"
	case s.ZooKeeper != nil:
		return fmt.Sprintf("servers[%d]", i)
	default:
		return fmt.Sprintf("endpoints[%d]", i)
	}
}

// Endpoints are the host:port addresses the store is reached at, as written
// (for Sentinel, the Sentinels).
func (s Spec) Endpoints() []string {
	switch {
	case s.Redis != nil:
		return slices.Clone(s.Redis.Endpoints)
	case s.Postgres != nil:
		return []string{net.JoinHostPort(s.Postgres.Host, strconv.Itoa(int(pgPort(s.Postgres))))}
	case s.ZooKeeper != nil:
		return slices.Clone(s.ZooKeeper.Servers)
	case s.Etcd != nil:
		return slices.Clone(s.Etcd.Endpoints)
	}
	return nil
}

// Summary is where the store is, for status.endpoints: the endpoints and
// what selects the data within (database, root, prefix, Sentinel master).
func (s Spec) Summary() string {
	eps := strings.Join(s.Endpoints(), ",")
	switch {
	case s.Redis != nil && s.Redis.Sentinel != nil:
		return fmt.Sprintf("%s (sentinel %s, db %d)", eps, s.Redis.Sentinel.MasterName, s.Redis.DB)
	case s.Redis != nil:
		return fmt.Sprintf("%s (db %d)", eps, s.Redis.DB)
	case s.Postgres != nil:
		return fmt.Sprintf("%s/%s (schema %s)", eps, s.Postgres.Database, orDefault(s.Postgres.Schema, pglock.DefaultSchema))
	case s.ZooKeeper != nil:
		return eps + orDefault(s.ZooKeeper.Root, zklock.DefaultRoot)
	case s.Etcd != nil:
		return eps + " " + orDefault(s.Etcd.Prefix, etcdlock.DefaultPrefix)
	}
	return ""
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func pgPort(p *locksv1alpha1.PostgresBackend) int32 {
	if p.Port == 0 {
		return pglock.DefaultPort
	}
	return p.Port
}

// normalized is a copy of s in which the order endpoints are listed in does
// not count: the same servers in another order are the same store.
func (s Spec) normalized() Spec {
	out := Spec{}
	if s.Redis != nil {
		out.Redis = s.Redis.DeepCopy()
		slices.Sort(out.Redis.Endpoints)
	}
	if s.Postgres != nil {
		out.Postgres = s.Postgres.DeepCopy()
	}
	if s.ZooKeeper != nil {
		out.ZooKeeper = s.ZooKeeper.DeepCopy()
		slices.Sort(out.ZooKeeper.Servers)
	}
	if s.Etcd != nil {
		out.Etcd = s.Etcd.DeepCopy()
		slices.Sort(out.Etcd.Endpoints)
	}
	return out
}

// Config is a resolved backend, credentials included: exactly one member is set.
type Config struct {
	Redis     *redislock.Config
	Postgres  *pglock.Config
	ZooKeeper *zklock.Config
	Etcd      *etcdlock.Config
	// OperationTimeout bounds each operation of a PostgreSQL, ZooKeeper or
	// etcd client (0: the store's default). Redis bounds every call to a
	// node by its node timeout already.
	OperationTimeout time.Duration
}

// TenantOperationTimeout bounds each operation on a PostgreSQL, ZooKeeper
// or etcd store that a namespace chose (a LockBackend), in place of the
// stores' defaults (2 s, 2 s and 5 s), which suit the stores an
// administrator runs. A tenant's store that answers every call at its full
// timeout holds a reconcile worker for at most this long per call; a
// healthy store answers in milliseconds. Redis's node timeout (at most
// 100 ms) stays as it is.
const TenantOperationTimeout = time.Second

// NewLocker returns the NewLockerFunc the manager uses: each store's own
// engine, logging through log.
func NewLocker(log logr.Logger) NewLockerFunc {
	return func(cfg Config) (Locker, error) {
		switch {
		case cfg.Redis != nil:
			return redislock.New(*cfg.Redis, redislock.WithLogger(log.WithName("redis")))
		case cfg.Postgres != nil:
			opts := []pglock.Option{pglock.WithLogger(log.WithName("postgres"))}
			if cfg.OperationTimeout > 0 {
				opts = append(opts, pglock.WithOperationTimeout(cfg.OperationTimeout))
			}
			return pglock.New(*cfg.Postgres, opts...)
		case cfg.ZooKeeper != nil:
			opts := []zklock.Option{zklock.WithLogger(log.WithName("zookeeper"))}
			if cfg.OperationTimeout > 0 {
				opts = append(opts, zklock.WithOperationTimeout(cfg.OperationTimeout))
			}
			return zklock.New(*cfg.ZooKeeper, opts...)
		case cfg.Etcd != nil:
			opts := []etcdlock.Option{etcdlock.WithLogger(log.WithName("etcd"))}
			if cfg.OperationTimeout > 0 {
				opts = append(opts, etcdlock.WithOpTimeout(cfg.OperationTimeout))
			}
			return etcdlock.New(*cfg.Etcd, opts...)
		}
		return nil, fmt.Errorf("the backend configuration names no store")
	}
}

// dialTimeout bounds one connection attempt (and TLS handshake) to a store.
const dialTimeout = 5 * time.Second

// resolve turns a backend and its Secrets into a client configuration and
// a fingerprint of everything that shapes the client: locks share a client
// only when every setting and credential is equal.
func (r *Registry) resolve(ctx context.Context, src *source) (Config, string, error) {
	spec, ns, field := src.spec, src.secretNamespace, src.field
	secret := func(name string, ref *locksv1alpha1.SecretKeyRef, what string) (string, error) {
		if ref == nil {
			return "", nil
		}
		return r.secretValue(ctx, ns, field+"."+name, ref, maxCredentialBytes, what)
	}
	// Every store but Redis speaks its own protocol and does its own TLS:
	// the dialer enforces the endpoint policy at every connection, and each
	// engine bounds the replies it reads (its MaxReplyBytes).
	dial := netguard.Dialer(netguard.DialOptions{Policy: src.endpoints, Timeout: dialTimeout, NotRESP: true})
	var (
		cfg     Config
		secrets []string
		caPEM   string
		err     error
	)
	switch {
	case spec.Redis != nil:
		var c redislock.Config
		if c, caPEM, err = r.resolveRedis(ctx, src); err != nil {
			return cfg, "", err
		}
		cfg.Redis, secrets = &c, []string{c.Password, c.SentinelPassword}
	case spec.Postgres != nil:
		p := spec.Postgres
		c := pglock.Config{Host: p.Host, Port: int(pgPort(p)), Database: p.Database, User: p.User, Schema: orDefault(p.Schema, pglock.DefaultSchema), Dial: dial}
		if c.Password, err = secret("passwordSecretRef", p.PasswordSecretRef, "a password"); err != nil {
			return cfg, "", err
		}
		if c.TLS, caPEM, err = r.tlsConfig(ctx, ns, field+".tls", p.TLS, p.Host); err != nil {
			return cfg, "", err
		}
		if err := c.Validate(); err != nil {
			return cfg, "", &ConfigError{Field: field, Err: err}
		}
		cfg.Postgres, secrets = &c, []string{c.Password}
	case spec.ZooKeeper != nil:
		z := spec.ZooKeeper
		c := zklock.Config{Servers: slices.Clone(z.Servers), Root: orDefault(z.Root, zklock.DefaultRoot), SessionTimeout: time.Duration(z.SessionTimeoutSeconds) * time.Second, MaxClockSkew: time.Duration(z.MaxClockSkewMilliseconds) * time.Millisecond, Dial: dial}
		if c.Digest, err = secret("digestSecretRef", z.DigestSecretRef, "a ZooKeeper digest"); err != nil {
			return cfg, "", err
		}
		if err := c.Validate(); err != nil {
			return cfg, "", &ConfigError{Field: field, Err: err}
		}
		cfg.ZooKeeper, secrets = &c, []string{c.Digest}
	case spec.Etcd != nil:
		e := spec.Etcd
		c := etcdlock.Config{Endpoints: slices.Clone(e.Endpoints), Prefix: orDefault(e.Prefix, etcdlock.DefaultPrefix), Username: e.Username, Dial: dial}
		if c.Password, err = secret("passwordSecretRef", e.PasswordSecretRef, "a password"); err != nil {
			return cfg, "", err
		}
		if c.TLS, caPEM, err = r.tlsConfig(ctx, ns, field+".tls", e.TLS, ""); err != nil {
			return cfg, "", err
		}
		if err := c.Validate(); err != nil {
			return cfg, "", &ConfigError{Field: field, Err: err}
		}
		cfg.Etcd, secrets = &c, []string{c.Password}
	default:
		return cfg, "", &ConfigError{Field: field, Err: spec.Validate()}
	}
	if src.tenant && spec.Redis == nil {
		cfg.OperationTimeout = TenantOperationTimeout
	}
	// The endpoint policy is part of the client: an inline and an
	// admin-owned backend on the same store never share one.
	policy := "unrestricted"
	if src.endpoints != nil {
		policy = fmt.Sprintf("policy:%p", src.endpoints)
	}
	settings, err := json.Marshal(spec.normalized())
	if err != nil {
		return cfg, "", &ConfigError{Field: field, Err: err}
	}
	parts := append([]string{src.id, string(settings), policy, caPEM, strings.Join(src.scopes, "\x01")}, secrets...)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return cfg, hex.EncodeToString(sum[:]), nil
}

// resolveRedis builds a Redis engine configuration (and returns the CA PEM it read).
func (r *Registry) resolveRedis(ctx context.Context, src *source) (redislock.Config, string, error) {
	rb, ns := src.spec.Redis, src.secretNamespace
	cfg := redislock.Config{Addrs: slices.Clone(rb.Endpoints), DB: int(rb.DB), Username: rb.Username, Prefix: KeyPrefix, Scopes: slices.Clone(src.scopes), EndpointPolicy: src.endpoints}
	var err error
	if rb.PasswordSecretRef != nil {
		if cfg.Password, err = r.secretValue(ctx, ns, src.field+".passwordSecretRef", rb.PasswordSecretRef, maxCredentialBytes, "a password"); err != nil {
			return cfg, "", err
		}
	}
	if s := rb.Sentinel; s != nil {
		cfg.MasterName = s.MasterName
		switch {
		case s.MinReplicas == nil:
			// The engine's default (redislock.DefaultMinReplicas).
		case *s.MinReplicas == 0:
			cfg.MinReplicas = redislock.NoReplicas
		default:
			cfg.MinReplicas = int(*s.MinReplicas)
		}
		if s.PasswordSecretRef != nil {
			if cfg.SentinelPassword, err = r.secretValue(ctx, ns, src.field+".sentinel.passwordSecretRef", s.PasswordSecretRef, maxCredentialBytes, "a password"); err != nil {
				return cfg, "", err
			}
		}
	}
	var caPEM string
	if cfg.TLS, caPEM, err = r.tlsConfig(ctx, ns, src.field+".tls", rb.TLS, ""); err != nil {
		return cfg, "", err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, "", &ConfigError{Field: src.field, Err: err}
	}
	return cfg, caPEM, nil
}

// tlsConfig builds the client TLS configuration t describes (nil: no TLS),
// with the CA bundle from its Secret. serverName, when set, is the name to
// verify if t names none (the PostgreSQL host; other stores verify the host
// of each endpoint they dial).
func (r *Registry) tlsConfig(ctx context.Context, ns, field string, t *locksv1alpha1.BackendTLS, serverName string) (*tls.Config, string, error) {
	if t == nil {
		return nil, "", nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: orDefault(t.ServerName, serverName)}
	if t.CASecretRef == nil {
		return cfg, "", nil
	}
	caPEM, err := r.secretValue(ctx, ns, field+".caSecretRef", t.CASecretRef, maxCABundleBytes, "a CA bundle")
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, "", &ConfigError{Field: field + ".caSecretRef", Err: fmt.Errorf("the Secret %s/%s key %q holds no PEM certificate", ns, t.CASecretRef.Name, t.CASecretRef.Key)}
	}
	cfg.RootCAs = pool
	return cfg, caPEM, nil
}
