// Package redis implements lock.Locker on Redis: one standalone server, a
// master found through Redis Sentinel, or the Redlock algorithm over 3, 5 or 7
// independent masters.
//
// Every operation on a node is one Lua script (in the lua directory, embedded
// and run with EVALSHA, falling back to EVAL): acquisition takes all keys of a
// lease or none, computes the fencing token and checks the FIFO queue; release
// and renewal compare the owner token before they delete or extend. Nothing
// ever deletes or extends a lock key without that comparison.
//
// # Keys in Redis
//
// For a lock key K and Config.Prefix P the Locker uses:
//
//	P{K}:lock       the mutex lease, with its TTL:
//	                "<length of owner>:<owner> <fence> <acquired us> <holder>" (lua/lease.lua)
//	P{K}:fence      last fencing token issued for K (no TTL: must outlive leases)
//	P{K}:queue      the queue: waiting owner -> rank (arrival less Boost)
//	P{K}:deadlines  waiting owner -> heartbeat deadline (server milliseconds)
//	P{K}:waiters    waiting owner -> "<since microseconds> <holder>", since
//	                being the waiter's arrival (its ticket); a waiter of a
//	                semaphore asking for more slots than one (lock.Request.Weight):
//	                "<since microseconds>:<weight> <holder>"
//	P{K}:slots      semaphore holder owner -> expiry (server milliseconds)
//	P{K}:slotfences semaphore holder owner -> fencing token (acquisition order)
//	P{K}:slotmeta   semaphore holder owner -> "<fence> <acquired us> <limit> <holder>",
//	                or "<fence> <acquired us> <limit>:<weight> <holder>" for a
//	                weight above 1
//	P{K}:replaced   owner a request with Replace dropped from the queue -> until
//	                (server milliseconds); TTL: its latest mark
//	P{K}:preempted  largest fencing token a request with Preempt stopped;
//	                TTL: the longest-lived holding it stopped
//	P{K}:released   pub/sub channel of K's releases
//	Plockwarden:ticket  ticket counter shared by all keys under P: the last
//	                arrival handed out (server microseconds)
//	P{S}:ticket     with Config.Scopes, the ticket counter of the keys of scope S
//
// A waiter's ticket is above every rank queued on its keys, whatever the
// counter says (a counter that is new, reset or not a number orders nobody
// ahead of those already waiting).
//
// # Priority
//
// A key's queue is ordered by rank: the waiter's arrival less its
// lock.Request.Boost, in microseconds (ties by owner). The arrival is the
// waiter's ticket: in standalone and Sentinel mode the server's TIME when it
// joins, made monotonic by the ticket counter (max(counter + 1, TIME)), so
// that equal boosts keep exact FIFO order between Lockers and operators
// sharing the server; in Redlock mode the client's proposal (its clock plus
// a lead) kept within each node's TIME +- 20ms, as before, so that the nodes
// give the same arrival and rank. The rank is computed in the acquisition
// script with the join, and a waiter that calls again within the waiter TTL
// keeps the arrival and rank it joined with, on every key (that of its
// latest arrival among them). Replace compares arrivals, not ranks. Clock
// skew: in standalone and Sentinel mode the order comes from the one
// master's clock (a failover to a replica whose clock is behind only delays
// new arrivals behind the counter, never reorders them); in Redlock mode
// arrivals are the clients' clocks within the window of each node's, so
// requests of operators whose clocks differ by d can be ordered up to d (at
// most the window) out of their real order, and a client skewed past the
// window gets a clamped, different arrival on each node until the nodes
// converge on the largest. The cost: a request without Boost sends the same
// arguments and makes the same calls as before; a waiter's join reads its
// waiters entry (one HGET per key) for its arrival; a request with Boost
// sends one more argument; Replace reads every waiter's arrival on its keys
// (one HGET each) instead of one range by score.
//
// Upgrade: places queued by an older release have their ticket as score and
// a since time that is not their ticket; they keep their score as their rank
// and their since time as their arrival (Replace). In standalone and Sentinel
// mode their tickets (small counter values) rank ahead of every arrival in
// microseconds, so they are served first, in their order, and then the new
// waiters; in Redlock mode their tickets were already client clocks, so old
// and new waiters are served in arrival order. An older release that joins
// after this one takes the counter (now an arrival) + 1, behind every
// waiter, and its Replace compares scores: during a rolling upgrade Boost
// holds only between operators of this release.
//
// A mutex (Limit 0 or 1) holds lock; a semaphore holder (Limit N > 1)
// holds one member of each slot key instead, expiring by the score in slots
// (pruned by the next semaphore script; the slot keys expire with their
// longest-lived holder). Both share fence and the queue keys, and each
// counts the other's holders: a mutex needs the key free of slots, a
// semaphore needs it free of a mutex holder. In Redlock mode a semaphore of N
// slots over M nodes needs floor(M*N/(N+1)) + 1 nodes, not a majority
// (quorumFor); that holds for weighted requests too: leases whose weights
// sum past N, each on that many nodes, would sum past N on some node.
//
// # Weights
//
// A semaphore request takes lock.Request.Weight of the N slots (1 to N; 0
// means 1), recorded with its holder (slotmeta) and, while it waits, with
// its waiters entry; an entry without a weight weighs 1, so a key where
// nobody asks for more than one slot is stored exactly as before, and what
// an older release wrote reads as weight 1. semacquire.lua admits a request
// when the weights of the live holders, of the live waiters queued ahead of
// it (every live waiter when it is not queued) and its own sum to at most
// the smallest limit among its own and the holders': strict FIFO by weight,
// so a heavy waiter at the head is not passed by lighter ones behind it.
// The cost: a request of weight 1 sends the same arguments as before; the
// script reads the weights of the waiters ahead (one ZRANGE and one HMGET,
// and a ZSCORE each, of fewer entries than the limit and the holders) only
// when their number alone leaves room.
//
// In Redlock mode a semaphore waiter keeps its place in the queue of a node
// that grants it (semacquire.lua's keepPlace) until it holds the lease, and
// then leaves the queues of every node (a waiter holding a slot there is
// not counted ahead: its slot is). When the attempt falls short of its
// quorum, the grants are released and the waiters behind it still wait
// behind it on every node, instead of each being granted where the other
// is not queued any more, in turn, attempt after attempt. A place the
// owner failed to leave expires with the waiter TTL, as that of a node
// that refused it.
//
// Inspect reports each holder's weight (lock.HolderState.Weight). Upgrade:
// an older release counts holders and places, not weights, and reads a
// weighted entry's limit, since time or holder as missing (its Inspect
// fails on a weighted waiter): ask for a weight above 1 only once every
// operator sharing the store runs this release.
//
// # Queue rules
//
// A request with Replace (lock.Request.Replace) drops, in the acquisition
// script, the waiters of its keys whose ticket is below its own (every
// waiter, when it holds no place yet) and marks each in replaced for two
// waiter TTLs: the scripts check the mark before anything else and answer
// {2, key}, which the Locker turns into an error matching lock.ErrReplaced.
// In Redlock mode that takes marks on more nodes than a quorum leaves out
// (then the owner also leaves the queues of the nodes that missed the
// drop); marks on fewer leave the waiter waiting. A request with
// Preempt also raises preempted to the tokens of the other holders of its
// keys: renew.lua and semrenew.lua read the mark with the holding and extend
// nothing of a holding at or below it (-key), so the lease stays valid until
// its Expires and is never shortened; the acquisition scripts refuse the
// preempted owner its own key while others wait. A later lease has a larger
// token than the mark and is not affected. In Redlock mode a renewal fails
// with lock.ErrPreempted when the preempted nodes are why it did not reach a
// quorum, and the write-back (raise.lua, semraise.lua) moves a mark along with the token of
// the holding it stopped. The rules run on every call of the request: on a
// node that missed a call, or lost its writes (a restart without
// persistence, a failover), the requester's next call while it waits drops
// and marks the older waiters still queued there and preempts the holders
// again. An older waiter whose mark alone was lost queues again, behind the
// requester, without being told.
//
// What a partition or a failover does to a mark: a mark is written on the
// nodes that answered the request. In Redlock mode the nodes cut off from
// the requester miss it: an older waiter is told once marks are on more
// nodes than a quorum leaves out, and a holder is stopped once preempted
// nodes keep its renewals from a quorum; a requester on the minority side of
// a partition stops nobody (and acquires nothing) until it reaches a
// majority again. In Sentinel mode a refused request with
// Replace waits for the replicas as a grant does (one WAIT, nothing more
// without the new fields), so the marks are on the replicas when the refusal
// is reported; when WAIT falls short they can be lost in a failover, and
// then the older waiters queue again and the preempted holder renews, until
// the requester's next call writes them again. Requests without Replace or
// Preempt make the same calls as before: acquirefast.lua's EXISTS takes the
// replaced key too (a key with marks takes the general path for two waiter
// TTLs), and renew.lua's GET of the lease is an MGET of it and the mark.
// Operators of an older release sharing the store ignore the marks (their
// scripts do not read them): during a rolling upgrade the rules hold only
// between operators of this release.
//
// In Sentinel mode every acquisition and renewal waits for
// Config.MinReplicas replicas (default 1) to acknowledge it (Redis WAIT)
// before it is reported, so that a failover to a replica does not lose it
// (replicas.go).
//
// See docs/safety.md for what the fencing token and Redlock do and do not guarantee.
package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// client is what the Locker needs from a go-redis client (*goredis.Client,
// including the Sentinel failover client, satisfies it).
type client interface {
	goredis.Scripter
	Pipeline() goredis.Pipeliner
	// Conn returns one connection of the pool, for commands that must
	// share it (WAIT after the script whose writes it counts).
	Conn() *goredis.Conn
	Ping(ctx context.Context) *goredis.StatusCmd
	Subscribe(ctx context.Context, channels ...string) *goredis.PubSub
	PSubscribe(ctx context.Context, patterns ...string) *goredis.PubSub
	Close() error
}

// scriptPipeliner runs scripts, alone or pipelined: a client, or one
// connection of it (*goredis.Conn).
type scriptPipeliner interface {
	goredis.Scripter
	Pipeline() goredis.Pipeliner
}

// node is one Redis endpoint: a server, or the Sentinel-managed master.
type node struct {
	name   string
	client client
}

// Locker is a lock.Locker on Redis. It is safe for concurrent use.
type Locker struct {
	cfg                              Config
	mode                             Mode
	nodes                            []*node
	quorum                           int
	lock.Acquisitions[time.Duration] // TryAcquire and Acquire, over attempt and wait
	// ticket is ticketKey(), built once; scopeTickets the counter of each
	// scope (Config.Scopes), by scope.
	ticket       string
	scopeTickets map[string]string
	// waiterTTLArg is the waiter TTL in milliseconds as a script argument,
	// converted once.
	waiterTTLArg any
	opts         options
	log          logr.Logger
	// replicas is how many replicas must acknowledge an acquisition or a
	// renewal (Config.MinReplicas resolved: 0 but in Sentinel mode).
	replicas int

	// tickets remembers, in Redlock mode, the queue ticket of each queued
	// owner, so that every node orders the waiters the same way.
	tickets sync.Map // owner -> int64

	// beforeWatch, when set (tests only), runs in Acquire between the first
	// failed attempt and the subscription to the release messages.
	beforeWatch func()
	// beforeWriteBack, when set (tests only), runs in a Redlock attempt
	// between the grants and the fence write-back.
	beforeWriteBack func()

	// lookup resolves a member's host name (Ping refuses Redlock members
	// that resolve to the same address); tests replace it.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	// bg tracks the work an acquisition leaves behind when it returns
	// before every node answered, and chains orders that work against the
	// Locker's next calls on the same keys (see cleanup.go).
	bg     *background
	chains chains
}

var _ lock.Locker = (*Locker)(nil)

// New builds a Locker. It validates cfg and the options but does not contact
// Redis; use Ping to check reachability.
func New(cfg Config, opts ...Option) (*Locker, error) {
	o, err := buildOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	l := &Locker{cfg: cfg, mode: cfg.Mode(), opts: o, lookup: lookupIP, bg: newBackground()}
	l.Acquisitions = lock.Acquisitions[time.Duration]{
		Check:   func(req lock.Request) error { return l.checkScopes("keys", req.Keys) },
		Attempt: l.attempt, Wait: l.wait,
		// Weighted semaphores: semacquire.lua counts the weights of the
		// holders and of the waiters ahead (lock.Request.Weight).
		Weights: true,
	}
	l.ticket = l.ticketKey()
	if len(cfg.Scopes) > 0 {
		l.scopeTickets = make(map[string]string, len(cfg.Scopes))
		for _, s := range cfg.Scopes {
			l.scopeTickets[s] = cfg.Prefix + "{" + s + "}:ticket"
		}
	}
	if l.mode == ModeSentinel {
		switch {
		case cfg.MinReplicas == 0:
			l.replicas = DefaultMinReplicas
		case cfg.MinReplicas > 0:
			l.replicas = cfg.MinReplicas
		}
	}
	l.waiterTTLArg = o.WaiterTTL.Milliseconds()
	l.log = o.Log.WithValues("mode", string(l.mode))
	// Every connection goes through netguard's dialer, as every store's
	// does: the endpoint policy and TLS (go-redis does no TLS of its own
	// when a Dialer is set, so TLSConfig stays unset and nothing is wrapped
	// twice). On top of it, the plaintext side of every connection is
	// wrapped with LimitReplies, the bound on replies. The Sentinel client
	// uses the same dialer for the Sentinels and for the master they name.
	netDial := netguard.Dialer(netguard.DialOptions{Policy: cfg.EndpointPolicy, TLS: cfg.TLS, Timeout: dialTimeout})
	dialer := limitingReplies(netDial, replyLimits)
	// Every call bounds itself with its context's deadline (the node
	// timeout, a quarter of the TTL, an inspection batch's allowance).
	// go-redis takes the sooner of that deadline and its own read and write
	// timeouts, whose default (5s) would silently cut a longer bound short:
	// its own are only a backstop here, above every bound a call sets.
	ioTimeout := max(ioBackstop, o.nodeTimeout)
	switch l.mode {
	case ModeSentinel:
		// go-redis speaks RESP3 to the Sentinels whatever Protocol says
		// (its Sentinel client options leave it out): their connections get
		// the same bounds without the RESP2-only rule; the master's (any
		// other address) keep it.
		sentinelLimits := replyLimits
		sentinelLimits.RESP2 = false
		sentinelDialer := limitingReplies(netDial, sentinelLimits)
		sentinels := map[string]bool{}
		for _, a := range cfg.Addrs {
			sentinels[a] = true
		}
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:       cfg.MasterName,
			SentinelAddrs:    cfg.Addrs,
			SentinelPassword: cfg.SentinelPassword,
			Username:         cfg.Username,
			Password:         cfg.Password,
			DB:               cfg.DB,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if sentinels[addr] {
					return sentinelDialer(ctx, network, addr)
				}
				return dialer(ctx, network, addr)
			},
			Protocol:              2, // see replyLimits
			ReadTimeout:           ioTimeout,
			WriteTimeout:          ioTimeout,
			MaxRetries:            -1,
			DialTimeout:           dialTimeout,
			DialerRetries:         1,
			ContextTimeoutEnabled: true,
		})
		name := fmt.Sprintf("%s (Sentinels %s)", cfg.MasterName, strings.Join(cfg.Addrs, ","))
		l.nodes = []*node{{name: name, client: c}}
	default:
		for _, a := range cfg.Addrs {
			c := goredis.NewClient(&goredis.Options{
				Addr:                  a,
				Username:              cfg.Username,
				Password:              cfg.Password,
				DB:                    cfg.DB,
				Dialer:                dialer,
				Protocol:              2, // see replyLimits
				ReadTimeout:           ioTimeout,
				WriteTimeout:          ioTimeout,
				MaxRetries:            -1,
				DialTimeout:           dialTimeout,
				DialerRetries:         1,
				ContextTimeoutEnabled: true,
				// Maintenance notifications (a server telling the client to
				// move its connections elsewhere) need RESP3 push frames, and
				// a tenant's server must not steer the operator's
				// connections: off.
				MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			})
			l.nodes = append(l.nodes, &node{name: a, client: c})
		}
	}
	l.quorum = len(l.nodes)/2 + 1
	return l, nil
}

// limitingReplies wraps every connection dial makes with LimitReplies.
func limitingReplies(dial func(ctx context.Context, network, addr string) (net.Conn, error), limits Limits) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return LimitReplies(conn, limits), nil
	}
}

// replyLimits bound what a Redis server (maybe a tenant's fake one) can make
// this process allocate, before the bytes arrive (LimitReplies):
//
//   - RESP2 only (the clients ask for Protocol 2): no maps, sets, attributes
//     or pushes, whose headers go-redis sizes maps and slices by. The
//     scripts, Sentinel and pub/sub all work on RESP2.
//   - aggregates of at most maxReplyElements, bulk strings of at most
//     maxReplyBulk: far above what the scripts, INFO, CONFIG GET and
//     SENTINEL REPLICAS return, far below LimitReplies' general defaults;
//   - replyBudget shared by every connection of every Locker of the
//     process: what the replies in flight announce together.
var replyLimits = Limits{
	MaxBulk:     maxReplyBulk,
	MaxElements: maxReplyElements,
	RESP2:       true,
	Budget:      replyBudget,
}

const (
	// maxReplyBulk bounds one bulk string of a reply (1 MiB).
	maxReplyBulk = 1 << 20
	// maxReplyElements bounds one aggregate of a reply.
	maxReplyElements = 1 << 16
	// ReplyBudgetBytes is what the Redis replies in flight may announce
	// together in this process (64 MiB).
	ReplyBudgetBytes = 64 << 20
)

// replyBudget is the process's budget for Redis replies in flight.
var replyBudget = lock.NewReplyBudget(ReplyBudgetBytes)

// lookupIP resolves a host name to its IP addresses.
func lookupIP(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// dialTimeout bounds one connection attempt, TLS handshake included.
const dialTimeout = time.Second

// ioBackstop is go-redis's own read and write timeout (at least the node
// timeout): a call without a deadline of its own would wait this long at
// most. Every call of the engine has a sooner one.
const ioBackstop = time.Minute

// Mode reports how the Locker reaches Redis.
func (l *Locker) Mode() Mode { return l.mode }

// Close closes the connections to every node. Leases stay in Redis until
// released or expired.
//
// Calls that acquisitions left running (to nodes that had not answered
// when the outcome was decided) and their cleanup are cancelled, and Close
// waits for them: a lease granted late on such a node expires with its TTL.
func (l *Locker) Close() error {
	if l.bg != nil {
		l.bg.stop()
		// Closing the clients ends the reads still blocked on a slow node.
		defer l.bg.wait()
	}
	var errs []error
	for _, n := range l.nodes {
		if err := n.client.Close(); err != nil {
			errs = append(errs, &lock.NodeError{Node: n.name, Err: err})
		}
	}
	return errors.Join(errs...)
}

// Ping checks that the backend answers: the server, the Sentinel-managed
// master, or a majority of the Redlock masters. The error matches
// lock.ErrBackendUnavailable or lock.ErrQuorum and names the failing nodes.
//
// In Redlock mode it first resolves the members' host names, and refuses
// (a *ConfigError on the later entry, matching lock.ErrInvalidConfig) two
// members that resolve to the same address and port: they are one server.
func (l *Locker) Ping(ctx context.Context) error {
	if err := l.checkResolvedMembers(ctx); err != nil {
		return err
	}
	res := fanOut(ctx, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (struct{}, error) {
		if err := n.client.Ping(ctx).Err(); err != nil {
			return struct{}{}, fmt.Errorf("ping: %w", err)
		}
		return struct{}{}, nil
	})
	ok, errs := 0, []error(nil)
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.nodeErr())
			continue
		}
		ok++
	}
	if ok >= l.quorum {
		return nil
	}
	return l.failure("ping", ok, errs)
}

// failure builds the error of an operation that did not reach enough nodes:
// ErrBackendUnavailable for one node, a *QuorumError for Redlock.
func (l *Locker) failure(op string, agreed int, errs []error) error {
	return l.failureOf(op, agreed, l.quorum, errs)
}

// failureOf is failure with the quorum the operation needed (quorumFor).
func (l *Locker) failureOf(op string, agreed, needed int, errs []error) error {
	if len(l.nodes) == 1 {
		return fmt.Errorf("%w: %s: %w", lock.ErrBackendUnavailable, op, errors.Join(errs...))
	}
	return &QuorumError{Op: op, Agreed: agreed, Needed: needed, Total: len(l.nodes), Cause: errors.Join(errs...)}
}

// quorumFor is how many nodes must hold a lease that admits limit holders
// per key: floor(M*limit/(limit+1)) + 1 of M nodes. With limit 1 it is the
// majority. With limit N, N+1 leases each on q nodes would need (N+1)*q >
// M*N slots, more than M nodes admitting N holders each have: so at most N
// leases hold the key at once (see docs/safety.md, "Semaphores").
func (l *Locker) quorumFor(limit int) int {
	m, n := len(l.nodes), max(limit, 1)
	if m == 1 {
		return 1
	}
	return m*n/(n+1) + 1
}

// QuorumError is a Redlock operation that fewer than its quorum of nodes
// agreed to (a majority; more for a semaphore). It matches lock.ErrQuorum and
// unwraps to the per-node causes (*lock.NodeError, joined with errors.Join).
type QuorumError struct {
	// Op names the operation, for example `acquire keys ["a"]`.
	Op string
	// Agreed is how many nodes did it (for an acquisition, of those that had
	// answered when no quorum was possible any more); Needed is the quorum
	// (the majority, or floor(M*N/(N+1)) + 1 for a semaphore of N slots);
	// Total the node count.
	Agreed, Needed, Total int
	// Cause joins the per-node errors.
	Cause error
}

// Error says how many nodes agreed, how many were needed, and why each other node failed.
func (e *QuorumError) Error() string {
	msg := fmt.Sprintf("no quorum of lock nodes: %s: %d of %d nodes agreed, %d needed", e.Op, e.Agreed, e.Total, e.Needed)
	if e.Cause != nil {
		msg += ": " + strings.ReplaceAll(e.Cause.Error(), "\n", "; ")
	}
	return msg
}

// Is makes a QuorumError match lock.ErrQuorum.
func (e *QuorumError) Is(target error) bool { return target == lock.ErrQuorum }

// Unwrap returns the joined per-node causes.
func (e *QuorumError) Unwrap() error { return e.Cause }

// result is one node's answer in a fan-out.
type result[T any] struct {
	node *node
	val  T
	err  error
}

func (r result[T]) nodeErr() error { return &lock.NodeError{Node: r.node.name, Err: r.err} }

// answers returns the replies of the nodes that answered and the errors of
// the others, each naming its node.
func answers[T any](res []result[T]) (vals []T, errs []error) {
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.nodeErr())
			continue
		}
		vals = append(vals, r.val)
	}
	return vals, errs
}

// fanOut calls every node in parallel, each under its own timeout, and
// returns the answers in node order.
func fanOut[T any](ctx context.Context, nodes []*node, timeout time.Duration, call func(context.Context, *node) (T, error)) []result[T] {
	out := make([]result[T], len(nodes))
	run := func(i int) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		v, err := call(cctx, nodes[i])
		out[i] = result[T]{node: nodes[i], val: v, err: err}
	}
	if len(nodes) == 1 {
		run(0)
		return out
	}
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { run(i) })
	}
	wg.Wait()
	return out
}

// callTimeout is the per-node timeout of a call tied to a lease of the given TTL.
func (l *Locker) callTimeout(ttl time.Duration) time.Duration {
	return min(l.opts.nodeTimeout, ttl/4)
}

// drift is the clock drift allowance of the Redlock validity: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Key layout. See the package documentation.

func (l *Locker) channel(key string) string { return l.cfg.Prefix + "{" + key + "}:released" }

func (l *Locker) ticketKey() string { return l.cfg.Prefix + "lockwarden:ticket" }

// ticketFor returns the ticket counter of a lease's keys: its scope's
// (every key of a lease is in the scope of the first, or the request was
// refused), or the one shared by the prefix.
func (l *Locker) ticketFor(keys []string) string {
	if len(keys) > 0 {
		if s, ok := l.scopeOf(keys[0]); ok {
			return l.scopeTickets[s]
		}
	}
	return l.ticket
}

// scopeOf returns the scope (Config.Scopes) key is in; the longest when
// scopes nest.
func (l *Locker) scopeOf(key string) (string, bool) {
	best, ok := "", false
	for _, s := range l.cfg.Scopes {
		if strings.HasPrefix(key, s) && len(s) > len(best) {
			best, ok = s, true
		}
	}
	return best, ok
}

// checkScopes refuses keys outside Config.Scopes (when set), and a lease
// whose keys are in different scopes: they would draw tickets from
// different counters.
func (l *Locker) checkScopes(field string, keys []string) error {
	if len(l.cfg.Scopes) == 0 {
		return nil
	}
	first := ""
	for i, k := range keys {
		s, ok := l.scopeOf(k)
		if !ok {
			return &lock.InvalidRequestError{Field: fmt.Sprintf("%s[%d]", field, i),
				Reason: fmt.Sprintf("key %q is outside this backend's scopes %q: it may only lock keys that start with one of them", k, l.cfg.Scopes)}
		}
		if i == 0 {
			first = s
		} else if s != first {
			return &lock.InvalidRequestError{Field: fmt.Sprintf("%s[%d]", field, i),
				Reason: fmt.Sprintf("key %q is in scope %q, the first key in %q: the keys of one lease must share a scope", k, s, first)}
		}
	}
	return nil
}

// allChannelsPatterns match the release channel of every key the Locker
// may use: every key under the prefix, or, with Config.Scopes, every key
// of each scope.
func (l *Locker) allChannelsPatterns() []string {
	if len(l.cfg.Scopes) == 0 {
		return []string{l.prefixChannelsPattern()}
	}
	out := make([]string, 0, len(l.cfg.Scopes))
	for _, s := range l.cfg.Scopes {
		out = append(out, globEscape(l.cfg.Prefix)+"{"+globEscape(s)+"*}:released")
	}
	return out
}

// prefixChannelsPattern matches the release channel of every key under the
// prefix.
func (l *Locker) prefixChannelsPattern() string {
	return globEscape(l.cfg.Prefix) + "{*}:released"
}

// globEscape escapes the characters of s that a Redis glob pattern reads
// as special.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// allParts are the Redis keys of one lock key that inspect.lua takes, in
// its order.
var allParts = []string{"lock", "fence", "queue", "deadlines", "waiters", "slots", "slotfences", "slotmeta"}

// acquireParts are the Redis keys of one lock key that acquire.lua and
// semacquire.lua take, in their order: allParts and the marks of the queue
// rules (Request.Replace, Request.Preempt).
var acquireParts = append(allParts[:len(allParts):len(allParts)], "replaced", "preempted")

// slotParts are the keys of a semaphore's holders (semrelease.lua).
var slotParts = []string{"slots", "slotfences", "slotmeta"}

// renewParts and semRenewParts are the keys renew.lua and semrenew.lua take:
// the holding and the preemption mark.
var (
	renewParts    = []string{"lock", "preempted"}
	semRenewParts = []string{"slots", "slotfences", "slotmeta", "preempted"}
)

// redisKeys lists, for each lock key, the Redis keys named by parts (lock,
// fence, queue, deadlines, waiters, slots, slotfences, slotmeta, replaced,
// preempted), in the order the scripts expect.
func (l *Locker) redisKeys(keys []string, parts ...string) []string {
	return l.redisKeysCap(keys, 0, parts...)
}

// redisKeysCap is redisKeys with room for extra more keys. Every name is a
// slice of one string built at once: one allocation for all of them, on the
// path of every acquisition and release.
func (l *Locker) redisKeysCap(keys []string, extra int, parts ...string) []string {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	size *= len(keys)
	for _, k := range keys {
		size += len(parts) * (len(l.cfg.Prefix) + len(k) + len("{}:"))
	}
	var b strings.Builder
	b.Grow(size)
	for _, k := range keys {
		for _, p := range parts {
			b.WriteString(l.cfg.Prefix)
			b.WriteByte('{')
			b.WriteString(k)
			b.WriteString("}:")
			b.WriteString(p)
		}
	}
	all := b.String()
	out := make([]string, 0, len(keys)*len(parts)+extra)
	at := 0
	for _, k := range keys {
		for _, p := range parts {
			n := len(l.cfg.Prefix) + len(k) + len("{}:") + len(p)
			out = append(out, all[at:at+n])
			at += n
		}
	}
	return out
}

// leaseTag is lease.lua's tag of owner: "<length of owner>:<owner> ", the
// prefix of the value of every lock key owner holds. The mutex scripts are
// given the tag instead of the owner, so that none formats the length.
func leaseTag(owner string) string {
	return strconv.Itoa(len(owner)) + ":" + owner + " "
}

// scriptOwner is how the scripts of a lease of the given limit name its
// owner: the semaphore scripts by the owner token, the mutex scripts (limit
// 0 or 1) by its leaseTag.
func scriptOwner(owner string, limit int) string {
	if limit > 1 {
		return owner
	}
	return leaseTag(owner)
}

// ownerChannelArgs returns the arguments of the scripts that publish: owner
// (the token, or its leaseTag for a mutex script: scriptOwner), then channel,
// key-name pairs.
func (l *Locker) ownerChannelArgs(owner string, keys []string) []any {
	out := make([]any, 0, 1+2*len(keys))
	out = append(out, owner)
	for _, k := range keys {
		out = append(out, l.channel(k), k)
	}
	return out
}

// cleanupContext outlives the caller's context (best-effort cleanup after a
// cancelled call) but is bounded by the node timeout.
func (l *Locker) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), l.opts.nodeTimeout)
}
