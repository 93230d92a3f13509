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
	"strings"
	"time"

	"github.com/go-logr/logr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// storeKind is one store a backend can name: how its API member reads, and
// how it becomes a Locker. Each store has its own file (store_<name>.go);
// stores lists them. Adding a store is a member of locksv1alpha1.Store, a
// file here and a line in stores.
type storeKind struct {
	// field is the member's name in the API ("redis"); typ is what
	// status.type shows ("Redis").
	field, typ string
	// set tells whether s names this store.
	set func(s Spec) bool
	// endpoints are the host:port addresses the store is reached at, as
	// written; endpointField names the i-th of them in errors.
	endpoints     func(s Spec) []string
	endpointField func(i int) string
	// summary is where the store is, after its endpoints eps, for
	// status.endpoints: what selects the data within (database, root, ...).
	summary func(s Spec, eps string) string
	// normalize copies the member into out, in a form in which what does
	// not change the store (the order of endpoints) does not count.
	normalize func(s Spec, out *Spec)
	// check says what is wrong with the member beyond the API's rules (nil:
	// nothing). It runs before any Secret is read or connection made.
	check func(s Spec) error
	// resolve reads the member's Secrets and builds its engine's
	// configuration (Config.Engine), the secrets it holds (for the client
	// fingerprint) and the CA bundle it read. dial enforces the endpoint
	// policy at every connection.
	resolve func(ctx context.Context, r *Registry, src *source, dial dialFunc) (any, []string, string, error)
	// newLocker builds the engine's Locker from a Config resolve made,
	// logging through log.
	newLocker func(cfg Config, log logr.Logger) (Locker, error)
	// boundedCalls: the engine bounds every call itself (Redis's node
	// timeout), so a tenant's backend gets no TenantOperationTimeout.
	boundedCalls bool
}

// dialFunc connects to a store's endpoint.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// stores are the stores a backend can name, in API order.
var stores = []*storeKind{&redisStore, &postgresStore, &zookeeperStore, &etcdStore, &kubernetesStore}

// Spec is the store a backend names: exactly one member is set (the API's
// CEL rules see to that; Validate refuses anything else).
type Spec locksv1alpha1.Store

// ClusterSpec is the store a ClusterLockBackend names.
func ClusterSpec(b *locksv1alpha1.ClusterLockBackend) Spec { return Spec(b.Spec.Store) }

// NamespacedSpec is the store a LockBackend names.
func NamespacedSpec(b *locksv1alpha1.LockBackend) Spec { return Spec(b.Spec.Store) }

// kinds lists the stores s sets, in API order.
func (s Spec) kinds() []*storeKind {
	var out []*storeKind
	for _, k := range stores {
		if k.set(s) {
			out = append(out, k)
		}
	}
	return out
}

// kind is the one store s names (nil when not exactly one).
func (s Spec) kind() *storeKind {
	if ks := s.kinds(); len(ks) == 1 {
		return ks[0]
	}
	return nil
}

// Validate says why the spec names no single store, or what is wrong with
// the one it names (nil: it names one the operator can use).
func (s Spec) Validate() error {
	ks := s.kinds()
	switch len(ks) {
	case 1:
	case 0:
		fields := make([]string, len(stores))
		for i, k := range stores {
			fields[i] = k.field
		}
		return fmt.Errorf("spec sets no store: set one of %s", strings.Join(fields, ", "))
	default:
		fields := make([]string, len(ks))
		for i, k := range ks {
			fields[i] = k.field
		}
		return fmt.Errorf("spec sets %s: set exactly one store", strings.Join(fields, " and "))
	}
	if ks[0].check == nil {
		return nil
	}
	return ks[0].check(s)
}

// checkNames refuses control bytes in names the store receives verbatim,
// before the operator has seen a byte of what the server is: CR and LF
// would let them form requests of another, line-based protocol. names are
// pairs of field and value.
func checkNames(names ...[2]string) error {
	for _, n := range names {
		if i := controlByte(n[1]); i >= 0 {
			return fmt.Errorf("%s: byte %d is a control character (below 0x20, or 0x7f); the name is sent to the store as it is, so it must be printable", n[0], i)
		}
	}
	return nil
}

// Field is the spec field of the set member ("redis", "postgres", ...).
func (s Spec) Field() string {
	if k := s.kind(); k != nil {
		return k.field
	}
	return ""
}

// Type is the kind of store the spec names (TypeRedis, ...), "" when not exactly one.
func (s Spec) Type() string {
	if k := s.kind(); k != nil {
		return k.typ
	}
	return ""
}

// endpointField is what one of Endpoints is called in errors.
func (s Spec) endpointField(i int) string {
	if k := s.kind(); k != nil {
		return k.endpointField(i)
	}
	return fmt.Sprintf("endpoints[%d]", i)
}

// endpointsField names the i-th endpoint of a store that lists them in
// endpoints (Redis, etcd).
func endpointsField(i int) string { return fmt.Sprintf("endpoints[%d]", i) }

// Endpoints are the host:port addresses the store is reached at, as written
// (for Sentinel, the Sentinels).
func (s Spec) Endpoints() []string {
	if k := s.kind(); k != nil {
		return k.endpoints(s)
	}
	return nil
}

// Summary is where the store is, for status.endpoints: the endpoints and
// what selects the data within (database, root, prefix, Sentinel master).
func (s Spec) Summary() string {
	if k := s.kind(); k != nil {
		return k.summary(s, strings.Join(s.Endpoints(), ","))
	}
	return ""
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// normalized is a copy of s in which the order endpoints are listed in does
// not count: the same servers in another order are the same store.
func (s Spec) normalized() Spec {
	var out Spec
	for _, k := range s.kinds() {
		k.normalize(s, &out)
	}
	return out
}

// Config is a resolved backend, credentials included.
type Config struct {
	// Store is the API member of the store ("redis", "postgres", ...).
	Store string
	// Engine is the store engine's configuration (a *redis.Config of
	// package lock/redis, and so on), for tests to read.
	Engine any
	// Endpoints are the host:port addresses the store is reached at.
	Endpoints []string
	// OperationTimeout bounds each operation of a client (0: the store's
	// default; stores whose engine bounds every call already keep 0).
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
		for _, k := range stores {
			if k.field == cfg.Store {
				return k.newLocker(cfg, log.WithName(cfg.Store))
			}
		}
		return nil, fmt.Errorf("the backend configuration names no store (%q)", cfg.Store)
	}
}

// dialTimeout bounds one connection attempt (and TLS handshake) to a store.
const dialTimeout = 5 * time.Second

// resolve turns a backend and its Secrets into a client configuration and
// a fingerprint of everything that shapes the client: locks share a client
// only when every setting and credential is equal.
func (r *Registry) resolve(ctx context.Context, src *source) (Config, string, error) {
	spec, field := src.spec, src.field
	k := spec.kind()
	if k == nil {
		return Config{}, "", &ConfigError{Field: field, Err: spec.Validate()}
	}
	// The dialer enforces the endpoint policy at every connection; each
	// engine bounds the replies it reads (its MaxReplyBytes).
	dial := netguard.Dialer(netguard.DialOptions{Policy: src.endpoints, Timeout: dialTimeout})
	engine, secrets, caPEM, err := k.resolve(ctx, r, src, dial)
	if err != nil {
		return Config{}, "", err
	}
	cfg := Config{Store: k.field, Engine: engine, Endpoints: spec.Endpoints()}
	if src.tenant && !k.boundedCalls {
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

// secret reads the Secret key ref names for the backend src (nil ref: "").
func (r *Registry) secret(ctx context.Context, src *source, name string, ref *locksv1alpha1.SecretKeyRef, what string) (string, error) {
	if ref == nil {
		return "", nil
	}
	return r.secretValue(ctx, src.secretNamespace, src.field+"."+name, ref, maxCredentialBytes, what)
}

// engineConfig checks an engine configuration the way its Validate does,
// naming the backend's field in the error.
func engineConfig(field string, validate func() error) error {
	if err := validate(); err != nil {
		return &ConfigError{Field: field, Err: err}
	}
	return nil
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
