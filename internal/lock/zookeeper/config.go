package zookeeper

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// storeName names this store in its *lock.ConfigError.
const storeName = "zookeeper"

// Defaults.
const (
	// DefaultRoot is the znode under which a Locker keeps its nodes.
	DefaultRoot = "/lockwarden"
	// DefaultSessionTimeout is the session timeout asked of the ensemble: how
	// long the leases of a crashed (or partitioned) process live at most.
	DefaultSessionTimeout = 30 * time.Second
	// MinSessionTimeout is the shortest SessionTimeout accepted.
	MinSessionTimeout = time.Second
	// DefaultOperationTimeout bounds one request to ZooKeeper (see WithOperationTimeout).
	DefaultOperationTimeout = 2 * time.Second
	// DefaultMaxClockSkew is how far apart the servers' wall clocks may be
	// by default (see Config.MaxClockSkew): NTP keeps synchronized servers
	// within milliseconds of each other; half a second covers a server that
	// was just started or stepped.
	DefaultMaxClockSkew = 500 * time.Millisecond
	// MaxMaxClockSkew is the largest MaxClockSkew accepted.
	MaxMaxClockSkew = 10 * time.Minute
	// MaxReplyBytes bounds one packet from the server, the connect response
	// included. The client allocates the length a packet announces before
	// its bytes arrive, so a server (which a tenant may run) could otherwise
	// make it allocate up to 4 GiB per connection. ZooKeeper keeps node data
	// under 1 MiB (jute.maxbuffer); the largest replies the Locker reads
	// are a key node's children (its holder and queued waiters, tens of
	// bytes each). 4 MiB is about four times the Java client's own bound.
	MaxReplyBytes = 4 << 20
	// MaxReplyElements bounds the names in one list of children and the
	// entries of one ACL. The client allocates a list from its declared
	// count before reading its entries (a 36-byte packet could declare
	// 2^32 names, about 64 GiB); a count is refused when it exceeds this
	// or the entries that fit in the rest of its packet. A key node has
	// one child per queued waiter.
	MaxReplyElements = 1 << 16
	// ReplyBudgetBytes bounds what the packets being read on every
	// ZooKeeper connection of the process announce together, with what the
	// client will allocate to decode them: sixteen tenants' servers each
	// sending 4 MiB packets cannot hold more than this at once.
	ReplyBudgetBytes = 64 << 20
)

// Config says which ZooKeeper ensemble a Locker uses and how.
type Config struct {
	// Servers are the ensemble members as host:port. The client connects to
	// one at a time and moves to another when it fails.
	Servers []string
	// Root is the znode under which every lock node lives (created when
	// missing). Lockers with different roots never see each other's leases.
	// Default: DefaultRoot.
	Root string
	// SessionTimeout is the session timeout asked of the ensemble (which may
	// grant less, between 2 and 20 ticks by default). A lease whose holder
	// crashed or was cut off lives at most this long; Lease.Expires never
	// extends past it. Default: DefaultSessionTimeout.
	SessionTimeout time.Duration
	// MaxClockSkew is how far apart the ensemble's servers' wall clocks may
	// be. ZooKeeper stamps each write (a node's mtime) with its leader's
	// clock, and an acquirer tells a holder that outlived its TTL (whose
	// Locker is gone) from a live one by comparing the holder's mtime, from
	// the leader of its last renewal, with the mtime of a node it just wrote,
	// from today's leader: a leader whose clock is ahead by more than this
	// makes live leases look expired, and a second holder gets the key
	// while the first still holds it. A holder is taken over only once its
	// TTL, the drift allowance and MaxClockSkew passed. Keep the servers on
	// NTP and this above their worst difference. Default:
	// DefaultMaxClockSkew; at most MaxMaxClockSkew.
	MaxClockSkew time.Duration
	// Digest, "user:password", turns on ZooKeeper digest authentication:
	// every session authenticates with it, and every node the Locker creates
	// gets an ACL that grants all rights to that identity only, so a client
	// without it can neither read nor change the lock nodes. Empty: no
	// authentication, nodes are open to everyone (world:anyone).
	Digest string
	// Dial, when set, opens every connection the client makes (to each
	// server, on every reconnect) instead of net.Dialer; the operator passes
	// a dialer that enforces its network policy. It receives the address as
	// configured in Servers (never resolved by the client first).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Validate checks the configuration and names the field that is wrong.
func (c Config) Validate() error {
	if len(c.Servers) == 0 {
		return &lock.ConfigError{Store: storeName, Field: "servers", Reason: "at least one ZooKeeper server host:port is required (list every ensemble member)"}
	}
	seen := map[string]bool{}
	for i, s := range c.Servers {
		field := fmt.Sprintf("servers[%d]", i)
		host, port, err := net.SplitHostPort(s)
		if err != nil || host == "" || port == "" || strings.ContainsAny(s, " \t\r\n,") {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q is not host:port (one server per entry, for example zk-0.zk:2181)", s)}
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("port %q of %q is not a number from 1 to 65535", port, s)}
		}
		if seen[s] {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("duplicate server %q: list every member once", s)}
		}
		seen[s] = true
	}
	if c.Root != "" {
		if err := validateRoot(c.Root); err != nil {
			return &lock.ConfigError{Store: storeName, Field: "root", Reason: err.Error()}
		}
	}
	if c.SessionTimeout != 0 && c.SessionTimeout < MinSessionTimeout {
		return &lock.ConfigError{Store: storeName, Field: "sessionTimeout", Reason: fmt.Sprintf("%v is below the minimum of %v (0 means the default, %v)", c.SessionTimeout, MinSessionTimeout, DefaultSessionTimeout)}
	}
	if c.MaxClockSkew < 0 || c.MaxClockSkew > MaxMaxClockSkew {
		return &lock.ConfigError{Store: storeName, Field: "maxClockSkew", Reason: fmt.Sprintf("%v is outside 0 to %v (0 means the default, %v)", c.MaxClockSkew, MaxMaxClockSkew, DefaultMaxClockSkew)}
	}
	if c.Digest != "" {
		user, pass, ok := strings.Cut(c.Digest, ":")
		if !ok || user == "" || pass == "" {
			return &lock.ConfigError{Store: storeName, Field: "digest", Reason: `must be "user:password" with a non-empty user and password (or empty for no authentication)`}
		}
	}
	return nil
}

// validateRoot checks that p is an absolute ZooKeeper path the Locker may
// create nodes under.
func validateRoot(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q must be an absolute znode path such as %q", p, DefaultRoot)
	}
	if p == "/" {
		return fmt.Errorf("%q: the ZooKeeper root itself cannot be used; use a path such as %q", p, DefaultRoot)
	}
	if strings.HasSuffix(p, "/") {
		return fmt.Errorf("%q must not end with '/'", p)
	}
	for i, seg := range strings.Split(p[1:], "/") {
		switch {
		case seg == "":
			return fmt.Errorf("%q has an empty path element ('//')", p)
		case seg == "." || seg == "..":
			return fmt.Errorf("%q must not contain %q elements", p, seg)
		case i == 0 && seg == "zookeeper":
			return fmt.Errorf("%q is under /zookeeper, which ZooKeeper reserves for itself", p)
		}
		for _, r := range seg {
			if r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || (r >= 0xfff0 && r <= 0xffff) || r == 0xfffd {
				return fmt.Errorf("%q contains the character %U, which ZooKeeper does not allow in paths", p, r)
			}
		}
	}
	return nil
}

func (c Config) root() string {
	if c.Root == "" {
		return DefaultRoot
	}
	return c.Root
}

func (c Config) maxClockSkew() time.Duration {
	if c.MaxClockSkew == 0 {
		return DefaultMaxClockSkew
	}
	return c.MaxClockSkew
}

func (c Config) sessionTimeout() time.Duration {
	if c.SessionTimeout == 0 {
		return DefaultSessionTimeout
	}
	return c.SessionTimeout
}

type options struct {
	lock.Options
	opTimeout time.Duration
}

// Option configures a Locker.
type Option func(*options)

// WithClock sets the clock the Locker reads: the start of every acquisition
// and renewal (Lease.Acquired, Lease.Expires and the validity left when the
// call returns), the lease timers that delete the holder nodes of an expired lease, and, when it has timers, Acquire's waits. The store's
// own expiry runs on its servers' clocks, so anything but the real clock is
// for tests. Default: the real clock.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.Clock = c } }

// WithLogger sets the logger. Acquisitions and releases are logged at V(1),
// ZooKeeper failures and session events at V(2), renewals at V(4). The ZooKeeper
// client's own log lines go to V(5). Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithOperationTimeout bounds each request to ZooKeeper (one round trip; an
// acquisition makes a few). A request that times out is reported as
// lock.ErrBackendUnavailable. Default: DefaultOperationTimeout.
func WithOperationTimeout(d time.Duration) Option { return func(o *options) { o.opTimeout = d } }

// WithWaiterTTL sets how long a queued waiter keeps its place in a key's
// queue without calling TryAcquire again; past it, measured on the
// ensemble's clock, the next acquirer of the key prunes it. Acquire refreshes
// its place at least every third of it. Default: lock.DefaultWaiterTTL; at least lock.MinWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// WithBackoff sets Acquire's fallback polling between attempts when no watch
// fires (exponential with jitter; Cap bounds the wait; Steps is ignored). A
// fired watch resets it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// buildOptions checks cfg and builds the options of a new Locker.
func buildOptions(cfg Config, opts []Option) (options, error) {
	if err := cfg.Validate(); err != nil {
		return options{}, err
	}
	o := options{Options: lock.DefaultOptions(), opTimeout: DefaultOperationTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.opTimeout <= 0 {
		return o, &lock.ConfigError{Store: storeName, Field: "WithOperationTimeout", Reason: fmt.Sprintf("%v: the timeout must be positive", o.opTimeout)}
	}
	o.CleanupTimeout = 2 * o.opTimeout
	return o, o.Validate(storeName)
}
