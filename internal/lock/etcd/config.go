package etcd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// DefaultPrefix is the key prefix when Config.Prefix is empty.
const DefaultPrefix = "/lockwarden/"

// storeName names this store in its *lock.ConfigError.
const storeName = "etcd"

// Config says which etcd cluster a Locker uses and how it connects.
type Config struct {
	// Endpoints are the client addresses of the cluster's members, host:port
	// without a scheme (the scheme follows TLS). At least one; the client
	// balances over them and fails over between them.
	Endpoints []string
	// Prefix is prepended to every etcd key the Locker uses, so lockers with
	// different prefixes never see each other's leases. It must end with "/"
	// so that no prefix is a prefix of another's keys. Default: DefaultPrefix.
	Prefix string
	// Username and Password authenticate to etcd (etcd auth). Optional; both
	// or neither.
	Username string
	// Password is the etcd user's password.
	Password string
	// TLS, when set, makes every gRPC connection use TLS with this
	// configuration. nil: plain TCP.
	TLS *tls.Config
	// Dial, when set, opens every network connection the client makes (the
	// operator passes a dialer that enforces its network policy); gRPC runs
	// TLS on top of the connection it returns. nil: net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Validate checks the configuration and names the field that is wrong.
func (c Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return &lock.ConfigError{Store: storeName, Field: "endpoints", Reason: "at least one etcd client address (host:port) is required"}
	}
	seen := map[string]bool{}
	for i, ep := range c.Endpoints {
		field := fmt.Sprintf("endpoints[%d]", i)
		if strings.Contains(ep, "://") {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q has a scheme: give host:port (TLS is chosen by the tls setting)", ep)}
		}
		host, port, err := net.SplitHostPort(ep)
		if err != nil || host == "" || port == "" || strings.ContainsAny(ep, " \t\r\n/") {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q is not host:port", ep)}
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q: port %q is not a number in 1-65535", ep, port)}
		}
		if seen[ep] {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("duplicate endpoint %q: list every member once", ep)}
		}
		seen[ep] = true
	}
	if c.Prefix != "" {
		if strings.ContainsAny(c.Prefix, " \t\r\n") {
			return &lock.ConfigError{Store: storeName, Field: "prefix", Reason: fmt.Sprintf("%q must not contain whitespace", c.Prefix)}
		}
		if !strings.HasSuffix(c.Prefix, "/") {
			return &lock.ConfigError{Store: storeName, Field: "prefix", Reason: fmt.Sprintf("%q must end with \"/\" (for example %q), so that it is never a prefix of another locker's keys", c.Prefix, c.Prefix+"/")}
		}
	}
	if (c.Username == "") != (c.Password == "") {
		return &lock.ConfigError{Store: storeName, Field: "username", Reason: "etcd auth needs both username and password, or neither"}
	}
	return nil
}

func (c Config) prefix() string {
	if c.Prefix == "" {
		return DefaultPrefix
	}
	return c.Prefix
}

// MaxReplyBytes bounds one gRPC message from the cluster. The etcd client
// otherwise accepts up to 2 GiB, buffering a message as it arrives, so a
// server (which a tenant may run) could make it hold that much per call.
// The largest replies the Locker reads are a key's queue (keys only) and
// watch events of its holders: kilobytes for ordinary queues. 4 MiB is
// gRPC's own default, above the 1.5 MiB etcd accepts in one request by
// default.
const MaxReplyBytes = 4 << 20

// MaxHeaderListBytes bounds the headers (and trailers) of one gRPC
// response, as the client advertises to the server in its HTTP/2 settings.
// gRPC's own default is 16 MiB per response, buffered as it arrives; etcd
// sends a content type, a status and a short message, well under a
// kilobyte. gRPC is moving its default to 8 KiB; 16 KiB leaves room.
const MaxHeaderListBytes = 16 << 10

// Defaults of the options.
const (
	// DefaultOpTimeout bounds one etcd call (see WithOpTimeout).
	DefaultOpTimeout = 5 * time.Second
	// DefaultDialTimeout bounds establishing a connection to one endpoint.
	DefaultDialTimeout = 5 * time.Second
)

type options struct {
	lock.Options
	opTimeout   time.Duration
	dialTimeout time.Duration
	// grpc are extra dial options (tests count the calls with them).
	grpc []grpc.DialOption
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
// etcd failures at V(2), renewals at V(4). Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithOpTimeout bounds each etcd call the Locker makes (a Grant, a Txn, a
// KeepAlive), on top of the caller's context; during a leader election a call
// waits up to this long for the new leader. Default: DefaultOpTimeout (5s).
func WithOpTimeout(d time.Duration) Option { return func(o *options) { o.opTimeout = d } }

// WithDialTimeout bounds establishing the connection to an endpoint.
// Default: DefaultDialTimeout (5s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithBackoff sets Acquire's fallback polling between attempts when no watch
// event arrives (exponential with jitter; Cap bounds the wait; Steps is
// ignored). An event resets it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// WithWaiterTTL sets how long a queued waiter keeps its place in a key's FIFO
// queue without calling TryAcquire again; its waiter key then expires with
// its etcd lease (granted for the TTL rounded up to whole seconds, and at
// least etcd's minimum lease TTL). Acquire refreshes its place at least every
// third of it. Default: lock.DefaultWaiterTTL (30s); at least lock.MinWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// buildOptions checks cfg and builds the options of a new Locker.
func buildOptions(cfg Config, opts []Option) (options, error) {
	if err := cfg.Validate(); err != nil {
		return options{}, err
	}
	o := options{Options: lock.DefaultOptions(), opTimeout: DefaultOpTimeout, dialTimeout: DefaultDialTimeout}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.opTimeout <= 0:
		return o, &lock.ConfigError{Store: storeName, Field: "WithOpTimeout", Reason: fmt.Sprintf("%v: the per-call timeout must be positive", o.opTimeout)}
	case o.dialTimeout <= 0:
		return o, &lock.ConfigError{Store: storeName, Field: "WithDialTimeout", Reason: fmt.Sprintf("%v: the dial timeout must be positive", o.dialTimeout)}
	}
	o.CleanupTimeout = o.opTimeout
	return o, o.Validate(storeName)
}
