package redis

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// MaxRedlockNodes is the largest number of independent masters a Redlock Locker accepts.
const MaxRedlockNodes = 7

// storeName names this store in its *lock.ConfigError.
const storeName = "redis"

// Mode is how a Locker reaches Redis.
type Mode string

const (
	// ModeStandalone uses one Redis server.
	ModeStandalone Mode = "Standalone"
	// ModeSentinel finds the master through Redis Sentinel and follows failovers.
	ModeSentinel Mode = "Sentinel"
	// ModeRedlock uses 3, 5 or 7 independent masters and needs a majority of them.
	ModeRedlock Mode = "Redlock"
)

// Config says which Redis servers a Locker uses and how it authenticates.
type Config struct {
	// Addrs are host:port addresses. One address: a standalone server. Three,
	// five or seven: independent masters (never replicas of each other) used
	// with the Redlock algorithm. With MasterName set: the Sentinels (any number).
	Addrs []string
	// MasterName, when set, makes Addrs Sentinels and the mode Sentinel: the
	// Locker talks to the master the Sentinels name and follows failovers.
	MasterName string
	// Username for Redis ACLs (AUTH username password). Optional.
	Username string
	// Password for the Redis servers (the master in Sentinel mode). Optional.
	Password string
	// SentinelPassword authenticates to the Sentinels (Sentinel mode only). Optional.
	SentinelPassword string
	// DB is the database index, 0 by default.
	DB int
	// TLS, when set, makes every connection use TLS with this configuration
	// (Sentinels included). Default: plain TCP.
	TLS *tls.Config
	// Prefix is prepended to every Redis key and pub/sub channel the Locker
	// uses, so that lockers with different prefixes never see each other's
	// leases (the operator puts the namespace in it). Default: empty.
	Prefix string
	// Scopes, when set, are the only key prefixes the Locker's keys may
	// start with (the operator gives a namespace's own backend that
	// namespace's scope, "ns/<namespace>/"): a request naming another key is
	// refused before anything is sent; a key's queue tickets come from its
	// scope's counter (Prefix+"{"+scope+"}:ticket") rather than the one
	// shared by the prefix; and Watch with no keys subscribes to the scopes'
	// releases only. Everything the Locker touches is then under
	// Prefix+"{"+scope, so a Redis ACL user limited to those keys and
	// channels (~P{scope* &P{scope*) can hold the locks of its scopes and
	// nothing else. Default: none (any key; one shared counter).
	Scopes []string
	// EndpointPolicy restricts which addresses the Locker connects to: the
	// configured addresses, what they resolve to, and (Sentinel mode) the
	// master the Sentinels name, all checked before any connection is made.
	// nil means no restriction (admin-owned backends); the operator sets it
	// for endpoints that tenants write. Whatever the policy, every reply is
	// checked to be Redis protocol within the Locker's limits (LimitReplies).
	EndpointPolicy *netguard.EndpointPolicy
	// MinReplicas (Sentinel mode only) is how many replicas must
	// acknowledge an acquisition or a renewal (Redis WAIT) before the
	// Locker reports it: Redis replicates asynchronously, and what the
	// master acknowledged but no replica received is lost when a Sentinel
	// promotes a replica. An acquisition fewer replicas acknowledge within
	// the replica timeout (WithReplicaTimeout) is released and fails with a
	// *ReplicaError; a renewal fails with one and leaves the lease valid
	// until its previous Expires. 0 means DefaultMinReplicas (1);
	// NoReplicas (-1) turns the wait off (the behaviour before the wait
	// existed: a failover can lose acknowledged leases). See
	// docs/safety.md for what WAIT does not guarantee.
	MinReplicas int
}

// DefaultMinReplicas is the MinReplicas of Sentinel mode when it is 0.
const DefaultMinReplicas = 1

// NoReplicas as Config.MinReplicas makes a Sentinel-mode Locker report
// acquisitions and renewals without waiting for any replica.
const NoReplicas = -1

// Validate checks the configuration and names the field that is wrong.
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return &lock.ConfigError{Store: storeName, Field: "Addrs", Reason: "at least one address is required: 1 for a standalone server, 3, 5 or 7 independent masters for Redlock, or the Sentinels together with MasterName"}
	}
	seen := map[string]bool{}
	for i, a := range c.Addrs {
		field := fmt.Sprintf("Addrs[%d]", i)
		if strings.TrimSpace(a) == "" {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: "an address must not be empty; use host:port"}
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q is not host:port", a)}
		}
		if seen[a] {
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("duplicate address %q: every node must be listed once", a)}
		}
		seen[a] = true
	}
	if c.MasterName == "" && len(c.Addrs) > 1 {
		if err := distinctMembers(c.Addrs, memberAddrs(c.Addrs, nil)); err != nil {
			return err
		}
	}
	if c.MasterName == "" {
		n := len(c.Addrs)
		switch {
		case n > MaxRedlockNodes:
			return &lock.ConfigError{Store: storeName, Field: "Addrs", Reason: fmt.Sprintf("%d addresses given: Redlock supports 3, 5 or 7 independent masters (at most %d); use 1 for a standalone server", n, MaxRedlockNodes)}
		case n > 1 && n%2 == 0:
			return &lock.ConfigError{Store: storeName, Field: "Addrs", Reason: fmt.Sprintf("%d addresses given: Redlock needs an odd number of independent masters (3, 5 or 7) so that a majority is unambiguous; use 1 for a standalone server", n)}
		}
		if c.SentinelPassword != "" {
			return &lock.ConfigError{Store: storeName, Field: "SentinelPassword", Reason: "only used in Sentinel mode: set MasterName too, or leave it empty"}
		}
		if c.MinReplicas != 0 {
			return &lock.ConfigError{Store: storeName, Field: "MinReplicas", Reason: "only used in Sentinel mode: set MasterName too, or leave it 0 (standalone servers and Redlock masters do not wait for replicas)"}
		}
	}
	if c.MinReplicas < NoReplicas {
		return &lock.ConfigError{Store: storeName, Field: "MinReplicas", Reason: fmt.Sprintf("%d: want a positive number of replicas, 0 for the default (%d), or NoReplicas (-1) not to wait for any", c.MinReplicas, DefaultMinReplicas)}
	}
	if c.DB < 0 {
		return &lock.ConfigError{Store: storeName, Field: "DB", Reason: fmt.Sprintf("%d is negative; database indexes start at 0", c.DB)}
	}
	if strings.ContainsAny(c.Prefix, " \t\r\n") {
		return &lock.ConfigError{Store: storeName, Field: "Prefix", Reason: fmt.Sprintf("%q must not contain whitespace", c.Prefix)}
	}
	if len(c.Scopes) > MaxScopes {
		return &lock.ConfigError{Store: storeName, Field: "Scopes", Reason: fmt.Sprintf("%d scopes given, at most %d", len(c.Scopes), MaxScopes)}
	}
	for i, s := range c.Scopes {
		field := fmt.Sprintf("Scopes[%d]", i)
		switch {
		case s == "":
			return &lock.ConfigError{Store: storeName, Field: field, Reason: "a scope must not be empty; leave Scopes empty to allow every key"}
		case len(s) > maxScopeBytes:
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%d bytes, at most %d", len(s), maxScopeBytes)}
		case strings.ContainsAny(s, scopeForbidden) || strings.ContainsFunc(s, unicode.IsControl):
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("%q must not contain whitespace, control characters, braces or the glob characters *?[]\\", s)}
		case slices.Contains(c.Scopes[:i], s):
			return &lock.ConfigError{Store: storeName, Field: field, Reason: fmt.Sprintf("duplicate scope %q", s)}
		}
	}
	return nil
}

// MaxScopes bounds Config.Scopes, and maxScopeBytes each of them.
const (
	MaxScopes     = 8
	maxScopeBytes = 256
)

// scopeForbidden are the characters a scope may not contain: they would
// end the hash tag, or be read as glob patterns in a Watch subscription
// and in the ACL rules an administrator writes for it.
const scopeForbidden = " \t\r\n{}*?[]\\"

// memberAddrs returns, for each host:port in addrs, the addresses the server
// is known under: a literal IP in its canonical form (an IPv4-mapped IPv6
// address as IPv4), both loopback addresses for localhost, and for another
// host name what resolve returns for it (nothing when resolve is nil or
// fails). Entries that are not host:port get nothing.
func memberAddrs(addrs []string, resolve func(host string) []netip.Addr) [][]netip.AddrPort {
	out := make([][]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		host, portStr, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil {
			continue
		}
		var ips []netip.Addr
		name := strings.TrimSuffix(strings.ToLower(host), ".")
		if ip, err := netip.ParseAddr(name); err == nil {
			ips = []netip.Addr{ip}
		} else if name == "localhost" {
			ips = []netip.Addr{netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})}
		} else if resolve != nil {
			ips = resolve(host)
		}
		for _, ip := range ips {
			out[i] = append(out[i], netip.AddrPortFrom(ip.Unmap(), uint16(port)))
		}
	}
	return out
}

// distinctMembers refuses two Redlock members that are the same server:
// the same host name and port (case aside), or a common address in known
// (memberAddrs). Two entries for one server would count one failure twice
// and let a minority of the servers grant a lease.
func distinctMembers(addrs []string, known [][]netip.AddrPort) error {
	for j := range addrs {
		for i := range j {
			same := ""
			hi, pi, erri := net.SplitHostPort(addrs[i])
			hj, pj, errj := net.SplitHostPort(addrs[j])
			if erri == nil && errj == nil && pi == pj && strings.EqualFold(strings.TrimSuffix(hi, "."), strings.TrimSuffix(hj, ".")) {
				same = "the same host and port"
			}
			for _, a := range known[i] {
				for _, b := range known[j] {
					if same == "" && a == b {
						same = "both are " + a.String()
					}
				}
			}
			if same != "" {
				return &lock.ConfigError{Store: storeName, Field: fmt.Sprintf("Addrs[%d]", j), Reason: fmt.Sprintf("%q and Addrs[%d] %q are the same server (%s): Redlock needs independent masters, each listed once", addrs[j], i, addrs[i], same)}
			}
		}
	}
	return nil
}

// checkResolvedMembers resolves the host names of the Redlock members and
// refuses two that resolve to a common address and port (see
// distinctMembers). A name that does not resolve is left to the connection
// to report.
func (l *Locker) checkResolvedMembers(ctx context.Context) error {
	if l.mode != ModeRedlock || l.lookup == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	known := memberAddrs(l.cfg.Addrs, func(host string) []netip.Addr {
		ips, err := l.lookup(ctx, host)
		if err != nil {
			return nil
		}
		return ips
	})
	return distinctMembers(l.cfg.Addrs, known)
}

// Mode returns the mode the configuration selects.
func (c Config) Mode() Mode {
	switch {
	case c.MasterName != "":
		return ModeSentinel
	case len(c.Addrs) > 1:
		return ModeRedlock
	default:
		return ModeStandalone
	}
}

// Defaults of the options.
const (
	// DefaultNodeTimeout is the per-node timeout of one call (see WithNodeTimeout).
	DefaultNodeTimeout = 100 * time.Millisecond
)

type options struct {
	lock.Options
	nodeTimeout time.Duration
	// replicaTimeout is WithReplicaTimeout's, 0 when not given (the node timeout).
	replicaTimeout    time.Duration
	replicaTimeoutSet bool
}

// Option configures a Locker.
type Option func(*options)

// WithClock sets the clock used for lease validity (Acquired, Expires, the
// elapsed time of an acquisition on its monotonic reading). When it also
// implements clock.Clock (for example clock.WithTicker), Acquire's waits use
// its timers. Default: the real clock.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.Clock = c } }

// WithLogger sets the logger. Acquisitions and releases are logged at V(1),
// node failures at V(2), renewals at V(4). Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithNodeTimeout bounds each call to one node. For calls tied to a lease
// (acquire, renew) it is further capped at a quarter of the lease TTL, so a
// slow node cannot eat the lease's validity. Default: DefaultNodeTimeout (100ms).
func WithNodeTimeout(d time.Duration) Option { return func(o *options) { o.nodeTimeout = d } }

// WithBackoff sets Acquire's fallback polling between attempts when no release
// message arrives (exponential with jitter; Cap bounds the wait; Steps is
// ignored). A release message resets it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// WithWaiterTTL sets how long a queued waiter keeps its place in a key's FIFO
// queue without a heartbeat (another TryAcquire with Queue); past it the next
// acquisition prunes it. Acquire heartbeats at least every third of it.
// Default: lock.DefaultWaiterTTL (30s); at least lock.MinWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// WithReplicaTimeout bounds how long an acquisition or a renewal in
// Sentinel mode waits for Config.MinReplicas replicas to acknowledge it (the
// timeout of Redis WAIT), further capped at a quarter of the lease TTL and
// rounded down to whole milliseconds (at least one). The wait counts against
// the lease's validity like the call itself. Default: the node timeout
// (WithNodeTimeout).
func WithReplicaTimeout(d time.Duration) Option {
	return func(o *options) { o.replicaTimeout, o.replicaTimeoutSet = d, true }
}

// buildOptions checks cfg and builds the options of a new Locker.
func buildOptions(cfg Config, opts []Option) (options, error) {
	if err := cfg.Validate(); err != nil {
		return options{}, err
	}
	o := options{Options: lock.DefaultOptions(), nodeTimeout: DefaultNodeTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case o.nodeTimeout <= 0:
		return o, &lock.ConfigError{Store: storeName, Field: "WithNodeTimeout", Reason: fmt.Sprintf("%v: the per-node timeout must be positive", o.nodeTimeout)}
	case o.replicaTimeoutSet && o.replicaTimeout < time.Millisecond:
		return o, &lock.ConfigError{Store: storeName, Field: "WithReplicaTimeout", Reason: fmt.Sprintf("%v: the replica timeout must be at least 1ms (Redis WAIT counts whole milliseconds, and 0 would wait forever)", o.replicaTimeout)}
	}
	if !o.replicaTimeoutSet {
		o.replicaTimeout = o.nodeTimeout
	}
	o.CleanupTimeout = o.nodeTimeout
	return o, o.Validate(storeName)
}
