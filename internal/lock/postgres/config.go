package postgres

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// storeName names this store in its *lock.ConfigError.
const storeName = "postgres"

// Defaults and limits.
const (
	// DefaultPort is PostgreSQL's port.
	DefaultPort = 5432
	// DefaultSchema is the schema the Locker keeps its tables in.
	DefaultSchema = "lockwarden"
	// MaxSchemaLen bounds the schema name: the NOTIFY channel is the schema
	// name plus "_released", and identifiers longer than 63 bytes are cut.
	MaxSchemaLen = 50
	// DefaultOperationTimeout bounds one operation against the database (see
	// WithOperationTimeout).
	DefaultOperationTimeout = 2 * time.Second
	// DefaultMaxConns is the default size of the connection pool (the
	// listening connection of Watch and Acquire comes on top).
	DefaultMaxConns = 8
	// MaxReplyBytes bounds the body of one message the server sends. pgx
	// would otherwise accept up to 1 GiB and allocate the announced length
	// before the body arrives, so a server (which a tenant may run) could
	// make every connection allocate 1 GiB with a 5-byte header. The largest
	// message the Locker reads is a row of Inspect (a key's holder, at most
	// lock.MaxInspectHolders semaphore holders and lock.MaxInspectWaiters
	// waiters) or a NOTIFY payload (at most 8000 bytes): tens of kilobytes
	// with holder identities of the operator's size. 4 MiB leaves ample
	// room for server error texts and is the bound the operator applies to
	// a Redis bulk reply.
	MaxReplyBytes = 4 << 20
	// MaxKeyBytes bounds one key: keys are stored in a btree primary key
	// (whose entries must stay well below a page) and sent hex-encoded in
	// NOTIFY payloads (at most 8000 bytes).
	MaxKeyBytes = 1024
)

// Config says which PostgreSQL database a Locker uses and how it connects.
// It is turned into a pgx configuration field by field, never through a
// connection string, so no value can smuggle in other connection parameters.
type Config struct {
	// Host is the server's DNS name or IP address (no Unix sockets, no
	// lists). Dial receives it exactly as written here.
	Host string
	// Port is the server's TCP port. Default: DefaultPort (5432).
	Port int
	// Database is the database name. Required.
	Database string
	// User is the role to log in as. Required. It needs CONNECT on the
	// database and CREATE on it (to create Schema) or on an existing Schema;
	// see the package documentation.
	User string
	// Password is the role's password (scram-sha-256 or md5). Optional.
	Password string
	// TLS, when set, makes every connection use TLS with this configuration
	// and refuses servers that do not speak it (sslmode=verify-full: the
	// certificate must be valid for ServerName, which defaults to Host).
	// nil: plain TCP, no TLS at all.
	TLS *tls.Config
	// Schema is the schema that holds the lease tables, created (and
	// migrated) on first use. Lockers with different schemas never see each
	// other's leases. A plain lower-case identifier: letters, digits and
	// underscores, not starting with a digit or "pg_". Default: DefaultSchema.
	Schema string
	// Dial, when set, opens every connection the Locker makes (the pool's,
	// the listening connection's, on every reconnect) instead of net.Dialer;
	// the operator passes a dialer that enforces its network policy. It
	// receives "Host:Port" with Host as written above, never an address the
	// client resolved first. Cancel requests, which PostgreSQL would take on
	// a new connection to the resolved address, are never sent: a cancelled
	// call closes its connection instead.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// schemaRE is a plain lower-case identifier, safe to quote and to embed in
// a NOTIFY channel name and in string literals.
var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// hostRE is a DNS name (letters, digits, hyphens, dots, underscores).
var hostRE = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$`)

// Validate checks the configuration and names the field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Host == "":
		return &lock.ConfigError{Store: storeName, Field: "host", Reason: "the server's DNS name or IP address is required, for example postgres.db.svc or 10.0.0.5"}
	case strings.HasPrefix(c.Host, "/"):
		return &lock.ConfigError{Store: storeName, Field: "host", Reason: fmt.Sprintf("%q is a Unix socket directory; only TCP is supported: give a DNS name or IP address", c.Host)}
	case strings.Contains(c.Host, ","):
		return &lock.ConfigError{Store: storeName, Field: "host", Reason: fmt.Sprintf("%q lists several hosts; give one DNS name or IP address (a failover setup belongs behind one name)", c.Host)}
	}
	if _, _, err := net.SplitHostPort(c.Host); err == nil {
		return &lock.ConfigError{Store: storeName, Field: "host", Reason: fmt.Sprintf("%q includes a port; give the host alone and the port in port", c.Host)}
	}
	if net.ParseIP(c.Host) == nil && (!hostRE.MatchString(c.Host) || len(c.Host) > 253) {
		return &lock.ConfigError{Store: storeName, Field: "host", Reason: fmt.Sprintf("%q is neither an IP address nor a DNS name (letters, digits, '-', '.', at most 253 characters)", c.Host)}
	}
	if c.Port != 0 && (c.Port < 1 || c.Port > 65535) {
		return &lock.ConfigError{Store: storeName, Field: "port", Reason: fmt.Sprintf("%d is not a TCP port: use 1 to 65535 (0 means %d)", c.Port, DefaultPort)}
	}
	if c.Database == "" {
		return &lock.ConfigError{Store: storeName, Field: "database", Reason: "the database name is required"}
	}
	if c.User == "" {
		return &lock.ConfigError{Store: storeName, Field: "user", Reason: "the role to log in as is required"}
	}
	for field, v := range map[string]string{"database": c.Database, "user": c.User, "password": c.Password} {
		if strings.ContainsRune(v, 0) {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: "must not contain a NUL byte"}
		}
	}
	if c.Schema != "" {
		if err := validateSchema(c.Schema); err != nil {
			return &lock.ConfigError{Store: storeName, Field: "schema", Reason: err.Error()}
		}
	}
	return nil
}

func validateSchema(s string) error {
	switch {
	case len(s) > MaxSchemaLen:
		return fmt.Errorf("%q is longer than %d characters", s, MaxSchemaLen)
	case !schemaRE.MatchString(s):
		return fmt.Errorf("%q is not a plain identifier: use lower-case letters, digits and underscores, not starting with a digit (for example %s)", s, DefaultSchema)
	case strings.HasPrefix(s, "pg_"):
		return fmt.Errorf("%q starts with pg_, which PostgreSQL reserves for system schemas", s)
	}
	return nil
}

// port returns the port with the default applied.
func (c Config) port() int {
	if c.Port == 0 {
		return DefaultPort
	}
	return c.Port
}

// schema returns the schema with the default applied.
func (c Config) schema() string {
	if c.Schema == "" {
		return DefaultSchema
	}
	return c.Schema
}

// endpoint names the server in errors: host:port as configured.
func (c Config) endpoint() string {
	return net.JoinHostPort(c.Host, fmt.Sprint(c.port()))
}

type options struct {
	lock.Options
	opTimeout time.Duration
	maxConns  int
	// admitExtra, set by tests only (the semaphore suites' negative
	// control), makes every semaphore request ask the database for that
	// many more slots than its Limit: a mutant the suites must catch.
	admitExtra int
}

// Option configures a Locker.
type Option func(*options)

// WithClock sets the clock the Locker reads: the start of every acquisition
// and renewal (Lease.Acquired, Lease.Expires and the validity left when the
// call returns), and, when it has timers, Acquire's waits. The store's
// own expiry runs on its servers' clocks, so anything but the real clock is
// for tests. Default: the real clock.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.Clock = c } }

// WithLogger sets the logger. Acquisitions and releases are logged at V(1),
// database failures at V(2), renewals at V(4). Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithOperationTimeout bounds each operation against the database (taking a
// pooled connection, or dialing one, included). For calls tied to a lease
// (acquire, renew) it is further capped at half the lease TTL, so a slow
// database cannot eat the lease's validity. Default: DefaultOperationTimeout.
func WithOperationTimeout(d time.Duration) Option { return func(o *options) { o.opTimeout = d } }

// WithWaiterTTL sets how long a queued waiter keeps its place in a key's FIFO
// queue without calling TryAcquire again; past it the next acquisition of the
// key prunes it. Acquire calls again at least every third of it. Default:
// lock.DefaultWaiterTTL (30s); at least lock.MinWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// WithBackoff sets Acquire's fallback polling between attempts when no
// notification arrives (exponential with jitter; Cap bounds the wait; Steps is
// ignored). A notification resets it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// WithMaxConns sets the size of the connection pool. Default: DefaultMaxConns.
func WithMaxConns(n int) Option { return func(o *options) { o.maxConns = n } }

// buildOptions checks cfg and builds the options of a new Locker.
func buildOptions(cfg Config, opts []Option) (options, error) {
	if err := cfg.Validate(); err != nil {
		return options{}, err
	}
	o := options{Options: lock.DefaultOptions(), opTimeout: DefaultOperationTimeout, maxConns: DefaultMaxConns}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.opTimeout <= 0:
		return o, &lock.ConfigError{Store: storeName, Field: "WithOperationTimeout", Reason: fmt.Sprintf("%v: the timeout must be positive", o.opTimeout)}
	case o.maxConns < 1:
		return o, &lock.ConfigError{Store: storeName, Field: "WithMaxConns", Reason: fmt.Sprintf("%d: the pool needs at least one connection", o.maxConns)}
	case o.maxConns > math.MaxInt32:
		return o, &lock.ConfigError{Store: storeName, Field: "WithMaxConns", Reason: fmt.Sprintf("%d: at most %d connections", o.maxConns, math.MaxInt32)}
	}
	o.CleanupTimeout = o.opTimeout
	return o, o.Validate(storeName)
}
