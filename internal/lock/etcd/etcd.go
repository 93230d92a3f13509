// Package etcd implements lock.Locker on an etcd v3 cluster.
//
// # Key layout
//
// Under Config.Prefix (P, default "/lockwarden/") every lock key K is stored
// under its encoding E = escape(K): bytes outside [A-Za-z0-9._:-] become %XX
// (so '%' and '/' are always escaped). E never contains '/', so no key's
// sub-keys are a prefix range of another key's (the queue of "a" is "P q/a/",
// and "a/b" is "a%2Fb"), and the escape is injective: different keys never
// collide.
//
//	P h/E          holder key: exists while a lease holds K; attached to the
//	               holding Locker's session (an etcd lease, see below).
//	P f/E          fence record: written (empty) by every acquisition of K and
//	               never attached to a lease, so its ModRevision is the last
//	               fencing token issued for K, also when K is free.
//	P s/E/T        slot key of a semaphore (Limit above 1) held by the
//	               owner whose tag is T, attached to the holding Locker's
//	               session like a holder key (see Semaphores).
//	P q/E/T        waiter key of the owner whose tag is T, attached to that
//	               waiter's own short etcd lease.
//	P r/E/T        replacement mark: a request with Replace dropped the owner
//	               whose tag is T from the queue of K; attached to an etcd
//	               lease of two waiter TTLs (see Queue policies).
//
// The owner token is secret; etcd only ever stores its tag T, the first 128
// bits of its SHA-256 in hex. Holder and slot values are "T {json}", the
// JSON recording holder identity, etcd lease ID, TTL and the client time of
// the acquisition, and for a slot the semaphore's Limit and its weight (the
// slots it takes, Request.Weight); waiter values are "!RA T {json}", the
// JSON recording the waiter's holder identity, etcd lease ID and when it
// joined, for a semaphore waiter the weight it asks for, and RA its place:
// its rank R and arrival A as 16 hex digits each (see Queues). A slot or
// waiter value without a weight (written by an earlier version, or a mutex
// waiter's) takes or asks for one slot. Owner checks are made inside
// transactions by comparing the value with the range ["T ", "T!"), which
// holds exactly the values that start with "T ".
//
// # Acquisition and fencing
//
// Holder keys are attached to a session: one etcd lease per Locker and TTL
// (in whole seconds; etcd raises it further to its minimum lease TTL, 1.5
// election timeouts, when smaller: the keys may then stay held longer than
// asked, never shorter), as the concurrency package's Session. TryAcquire
// keeps the session alive first when less than half the TTL of it is left,
// then runs one transaction that compares every holder key absent
// (CreateRevision 0) and the queue condition, and on success puts every
// holder key with the session and touches every fence record. Taking all
// keys in one transaction makes multi-key leases all-or-nothing without a
// lock order, so two requests for the same keys in different orders cannot
// deadlock. Each value carries a random attempt number: when the answer of
// a transaction is lost (or its lease cannot be used), the keys whose value
// is still exactly the one it wrote are deleted in the background until
// etcd answers, since the session would otherwise keep them held for as long
// as the Locker lives; a later acquisition (of the same owner too) is never
// touched.
//
// The fencing token is the revision of the acquiring transaction: the
// ModRevision of the keys' fence records, which only acquisitions write
// (for a fresh acquisition also the holder keys' CreateRevision). etcd
// revisions are global, strictly increasing and replicated by raft, so a
// token is larger than every token issued before for any key, across leader
// changes and restarts of members. Tokens past lock.MaxFence are refused
// (the acquisition is undone).
//
// # Recovery
//
// Renew and Release need only Keys, Owner and Fence: the transaction compares
// each holder key's value with the owner's tag (so the key must exist) and
// the ModRevision of its fence record with the fence, and reads the etcd
// lease ID from the value. So a new Locker (a new process) renews and
// releases a lease an older one acquired, with the same token.
//
// RenewAll (and Renew, RenewAll of one lease) keeps the Locker's session
// for the TTL alive once (KeepAliveOnce), then reads the holder keys and
// fence records of the leases in read-only transactions of up to 64 keys
// (linearizable reads: nothing is written) and checks each lease's owner
// and token. Renewing any number of leases is one keepalive per TTL, not
// one per lease. A lease whose keys are attached to another etcd lease (one
// acquired by another Locker, a process before a restart, or with another
// TTL) is moved to the session once, in a transaction that checks the owner
// again and leaves the fence records alone (the token is unchanged); the
// other etcd lease is not revoked unless it was granted for that acquisition
// alone (by an earlier version). The reads come after the keepalive: a key
// found attached to the session is held until the keepalive's start + TTL
// at least. Release deletes the holder keys in a transaction that checks the
// owner, and tries again in the background when etcd does not answer. A
// TryAcquire by an owner that already holds all the keys (from one
// acquisition) re-puts them on the session and rewrites their fence records
// in one transaction that checks the owner and the old token: it is a new
// acquisition with a new, larger token (the transaction's revision), as on
// the other stores, and the lease with the old token is lost (Renew fails
// with lock.ErrLost, Release with lock.ErrNotHeld, neither touching the new
// acquisition).
//
// A lease on a session stays held while the session is kept alive, that is
// while the Locker renews any lease of that TTL: a caller ends a lease by
// releasing it. When the session expires (nothing renewed it for its TTL:
// the process died, or etcd was out of reach), etcd deletes every key on
// it, and each lease on it is lost.
//
// # TTL and server failures
//
// etcd expires the lease on its leader, which deletes the holder keys (and
// sends the watch events that wake waiters), whether or not the acquiring
// process is alive. Lease.Expires is the start of the session's last
// confirmed keepalive (or grant; for a renewal, one made during the call)
// plus the TTL minus a drift allowance (1% + 2ms), never later than the
// leader may free the keys. A new leader restarts every lease's TTL (plus an
// election timeout) when it takes over: after a leader change the keys may
// stay held up to a TTL longer than asked, which delays others but never
// gives two holders. While no
// quorum is available nothing can be acquired, renewed or released (errors
// match lock.ErrBackendUnavailable) and no lease expires either; a held
// lease is only lost through its TTL, as usual, once a leader is back.
//
// # Queues
//
// A request with Queue that cannot take its keys joins the queue of every
// key with one transaction that puts all its waiter keys together, so they
// share one CreateRevision (its arrival ticket, which Replace compares) and
// one place. Its waiter keys carry one etcd lease of the waiter TTL; calling
// TryAcquire again refreshes it (KeepAliveOnce) and keeps its place, and a
// waiter that stops calling loses its place when the lease expires (etcd
// prunes dead waiters by itself). A request without Queue takes the keys
// only when the queues are empty.
//
// A queue is ordered by rank, the waiter's arrival less its Request.Boost
// (priority with aging: a boosted waiter goes ahead of those that arrived
// less than its boost before it, never ahead of one that waited longer),
// then by arrival. The place is written at the front of the waiter value
// ("!" then the rank and the arrival, µs, as 16 hex digits each with the
// sign bit flipped), so the values' byte order is the queue's order (rank,
// arrival, then owner tag). A queued request takes the keys when no waiter
// of each is ranked ahead of it: its transaction compares its waiter key's
// CreateRevision unchanged and every waiter value of the queue above its
// own place and tag (one range compare on the values). A semaphore waiter's
// turn may come with waiters ahead of it: when the weights of the slots
// held, of every waiter ahead of it and its own fit in the limit (strict
// FIFO by weight, see Semaphores); it compares instead that no waiter
// joined or was written since its read, so the weights ahead of it can only
// have fallen.
//
// etcd offers no clock to a transaction, so the arrival is the joining
// client's clock in µs, made monotonic by the queue: above every arrival
// the join read on its keys (max(now, last + 1)). A join that starts after
// another one ended therefore arrives later, from any Locker on the prefix,
// and equal boosts keep exact FIFO order whatever the clocks of the
// operators' hosts; the members' clocks play no part (the order is the
// values, replicated by raft with the queue). Skew between the hosts of two
// operators shifts their boosts against each other by up to the skew: a
// waiter may be overtaken by a boost of b from a host whose clock is d
// behind when it has waited less than b + d, and a waiter from a host ahead
// ranks up to that much later. Two joins that overlap may be ordered
// either way.
//
// Cost: a request with Queue reads the waiter values of its keys' queues
// (in the transactions it made already, with no extra round trip) and its
// values are 34 bytes longer; the head check is still one compare per key,
// and a refresh is still one keepalive. A request without Queue pays
// nothing. A Boost costs nothing more. A weight costs a dozen bytes in the
// slot and waiter values of a semaphore, no operation: the weights are
// summed from the values the attempt reads anyway.
//
// # Semaphores
//
// A request with Limit above 1 takes a slot key of each key (P s/E/T)
// instead of the holder key, whose value records the Limit and the weight
// (Request.Weight, the slots it takes). It fits when no mutex holds the key
// and used + ahead + its weight is at most the smallest limit among its own
// and the holders': used is the sum of the weights of the other owners'
// slots, ahead that of the waiters queued ahead of it (their values carry
// their weights), so a heavy waiter at the head is never passed by lighter
// ones behind it; a request without Queue takes slots only while nobody
// waits. Its transaction puts the slot keys on the condition that no slot
// of the key was created or written since its read (one range compare of
// ModRevision), with the queue conditions above: what it counted can only
// have fallen. Slot and waiter values of earlier versions carry no weight
// and count as one slot, so the keys they hold or wait for stay within the
// limit after an upgrade; an earlier version counts holders rather than
// weights, so the weights hold between Lockers that have them.
//
// Waiter values of earlier versions have no place (they start with the
// owner tag, above "!" in byte order): this version serves them after the
// ranked waiters, among themselves in CreateRevision order (an earlier
// version still takes a key when its waiter is the oldest by CreateRevision,
// so both may go for a free key; ordering them by the time they joined
// could make a ranked waiter and an older one wait for each other for
// ever). When the owner of such a waiter calls again with this version, the
// join rewrites its value with a place (same key and etcd lease, so the same
// CreateRevision): ranked without boost at the time it joined.
//
// # Wake-ups
//
// Watch is an etcd watch for DELETE events on the holder and slot keys (a release and
// a lease expiry both delete them) and the waiter keys (a waiter leaving may
// make the next one the head of a free key), re-established after errors
// and leader loss; after a compaction it delivers the keys that have
// waiters, since a release may have been missed. Acquire waits for the deletion of exactly what blocks it,
// watched from the revision its attempt (or its joining the queue) read, so
// nothing between the read and the watch is missed: a queued waiter watches the waiter key just
// ahead of it (as the concurrency package's waitDeletes does), the head
// watches the busy holder key. It also retries with exponential backoff and
// jitter as a fallback, and at least every third of the waiter TTL with Queue.
//
// # Queue policies
//
// Request.Replace and Request.Preempt are etcd keys and values, written in
// transactions that compare what they change with what the attempt read,
// so they hold between every Locker on the prefix.
//
// A request with Replace whose read finds older waiters on its keys (a
// waiter key with a smaller CreateRevision than its own; every waiter when
// it is not queued yet) drops them: one transaction (per 128 writes)
// compares each such waiter key's CreateRevision unchanged, deletes it and
// puts its owner's replacement mark, on an etcd lease of two waiter TTLs
// (of the replacing Locker) granted for the marks of that call. The
// attempt then reads again, and takes keys that are free now at once.
// Every acquisition transaction compares the caller's marks absent (one
// compare per key) and reads them in its Else branch, and joining a queue
// compares them absent too: a marked owner's TryAcquire fails with
// lock.ErrReplaced and does not join again until the mark expires.
//
// A request with Preempt also writes "preempted": true into the holder (or
// slot) value of every other owner's holding of its keys, in place: with
// the same etcd lease (IgnoreLease) and on the condition that the value is
// the one read. The fence records are not written, so the holding keeps its
// token and its lifetime. A renewal reads the values anyway: a preempted
// lease extends nothing and fails with lock.ErrPreempted. The first such
// renewal moves its keys off the session (which the Locker's other leases
// keep alive) to an etcd lease of their own, of the lease's whole TTL from
// then, later than any Expires given for it: the keys are freed when it
// ends or at Release, never earlier. A later acquisition writes a new value
// without the flag, so leases taken after the preemption are not affected;
// and an owner does not re-acquire keys whose holding was preempted while
// another owner waits for them (the re-acquisition would drop the flag).
//
// Cost: a request without Replace pays one more compare per key in its
// transactions and one more single-key read per key in the refusal's Else
// branch; no round trip. A renewal pays nothing. A request with Replace
// that finds something to drop or preempt pays a lease grant (for marks),
// the policy transaction and one more read.
//
// Marks and flags are ordinary keys replicated by raft: they are written
// only with a quorum, survive member restarts and leader changes, and a
// member cut off in a minority serves none of the linearizable reads and
// transactions that check them, so no attempt misses a committed mark. A
// new leader restarts the marks' etcd lease (plus an election timeout): a
// mark may then last up to that much longer. The marks' lease belongs to
// no session, so a mark outlives the replacing Locker. Earlier versions of
// the Locker ignore marks and flags (and may rewrite a holder value
// without the flag when they move it to their session): the policies hold
// between Lockers that have them. Nothing is migrated: a value without the
// flag is not preempted and an owner without a mark is not replaced.
package etcd

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Locker is a lock.Locker on an etcd cluster. It is safe for concurrent use.
type Locker struct {
	cfg                         Config
	opts                        options
	log                         logr.Logger
	prefix                      string
	node                        string
	lock.Renewals               // Renew and RenewAll, over renewAll
	lock.Acquisitions[waitHint] // TryAcquire and Acquire, over attempt and wait

	// ccfg is the client configuration; the client is made on first use
	// (see connect), since clientv3.New authenticates, blocking, when
	// etcd auth is configured.
	ccfg   clientv3.Config
	cliMu  sync.Mutex // serializes connect and Close
	cli    atomic.Pointer[clientv3.Client]
	closed bool

	// sessions are the etcd leases holder keys are attached to, by TTL in
	// whole seconds (see sessionFor); smu guards them and serializes their
	// grants and keepalives.
	smu      sync.Mutex
	sessions map[int64]*session

	// ctx ends with Close: it stops Watch goroutines and background revokes.
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup
}

var _ lock.Locker = (*Locker)(nil)

// New returns a Locker on the cluster cfg names. It does no network I/O:
// the etcd client is made on first use (with etcd auth that first call
// authenticates, waiting up to the dial timeout) and gRPC connects in the
// background.
func New(cfg Config, opts ...Option) (*Locker, error) {
	o, err := buildOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	ccfg := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: o.dialTimeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		TLS:         cfg.TLS,
		// The client's own logging would print every failed dial of a
		// member that is down; the Locker's errors carry the causes.
		Logger: zap.NewNop(),
		// Detect a dead connection (a member that was killed or cut off)
		// within seconds rather than the kernel's TCP timeout.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		// A message announced over the bound fails its call at once,
		// before any of it is read.
		MaxCallRecvMsgSize: MaxReplyBytes,
		// Response headers over the bound fail the call as they are read.
		DialOptions: []grpc.DialOption{grpc.WithMaxHeaderListSize(MaxHeaderListBytes)},
	}
	if dial := cfg.Dial; dial != nil {
		// Every gRPC connection (to every endpoint, on every reconnect) is
		// opened by the caller's dialer; gRPC runs TLS over it itself.
		ccfg.DialOptions = append(ccfg.DialOptions, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		}))
	}
	ccfg.DialOptions = append(ccfg.DialOptions, o.grpc...)
	ctx, cancel := context.WithCancel(context.Background())
	l := &Locker{
		cfg:    cfg,
		opts:   o,
		log:    o.Log,
		ccfg:   ccfg,
		prefix: cfg.prefix(),
		node:   strings.Join(cfg.Endpoints, ","),
		ctx:    ctx,
		cancel: cancel,
	}
	l.Renewals = lock.Renewals{Validate: validateRenew, Batch: l.renewAll}
	l.Acquisitions = lock.Acquisitions[waitHint]{Attempt: l.attempt, Wait: l.wait, Weights: true}
	return l, nil
}

// errClosed is the cause of operations on a closed Locker.
var errClosed = errors.New("the etcd Locker is closed")

// connect makes the etcd client on first use. Without auth that does no
// network I/O (gRPC connects in the background); with auth clientv3.New
// authenticates, which waits up to the dial timeout, and a failure is
// returned (and retried by the next call) rather than kept.
func (l *Locker) connect() error {
	if l.cli.Load() != nil {
		return nil
	}
	l.cliMu.Lock()
	defer l.cliMu.Unlock()
	if l.closed {
		return errClosed
	}
	if l.cli.Load() != nil {
		return nil
	}
	cli, err := clientv3.New(l.ccfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	l.cli.Store(cli)
	return nil
}

// etcd returns the client; only after connect succeeded.
func (l *Locker) etcd() *clientv3.Client { return l.cli.Load() }

// Close stops the Locker's watches and closes its connections. Held leases
// stay in etcd until released or expired.
func (l *Locker) Close() error {
	l.cancel()
	l.bg.Wait()
	l.cliMu.Lock()
	l.closed = true
	cli := l.cli.Load()
	l.cliMu.Unlock()
	if cli == nil {
		return nil
	}
	if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("close etcd client: %w", err)
	}
	return nil
}

// Ping makes one linearizable read (it needs a quorum, like every lease
// operation) and returns nil when etcd answers.
func (l *Locker) Ping(ctx context.Context) error {
	if err := l.connect(); err != nil {
		return l.unavailable("ping", err)
	}
	ctx, cancel := l.opCtx(ctx)
	defer cancel()
	if _, err := l.etcd().Get(ctx, l.prefix+"ping", clientv3.WithCountOnly()); err != nil {
		return l.unavailable("ping", err)
	}
	return nil
}

// opCtx bounds one etcd call by the op timeout.
func (l *Locker) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.opts.opTimeout)
}

// unavailable wraps an etcd or transport failure.
func (l *Locker) unavailable(op string, err error) error {
	if tooLarge := replyTooLarge(err); tooLarge != nil {
		err = fmt.Errorf("%w (%w)", tooLarge, err)
	}
	return fmt.Errorf("%w: %s: %w", lock.ErrBackendUnavailable, op, &lock.NodeError{Node: l.node, Err: err})
}

// replyTooLarge recognizes gRPC's refusal of a message over
// MaxCallRecvMsgSize (status ResourceExhausted, which the server also uses,
// for a full database, hence the text) and of response headers over
// MaxHeaderListBytes (recognized by their texts).
func replyTooLarge(err error) *lock.ReplyTooLargeError {
	if err == nil || errors.Is(err, lock.ErrReplyTooLarge) {
		return nil
	}
	st, ok := status.FromError(err)
	// A header list over the bound is cut (Internal); one header field
	// over it fails the connection's header decoding (COMPRESSION_ERROR).
	if ok && (st.Code() == codes.Internal && strings.Contains(st.Message(), "header list size exceeded") ||
		st.Code() == codes.Unavailable && strings.Contains(st.Message(), "COMPRESSION_ERROR")) {
		return &lock.ReplyTooLargeError{Store: "etcd", Limit: MaxHeaderListBytes, Detail: fmt.Sprintf(
			"the response headers exceed the limit of %d KiB (or could not be decoded)", MaxHeaderListBytes>>10)}
	}
	if !ok || st.Code() != codes.ResourceExhausted {
		return nil
	}
	var declared, limit int64
	if _, err := fmt.Sscanf(st.Message(), "grpc: received message larger than max (%d vs. %d)", &declared, &limit); err != nil {
		return nil
	}
	return &lock.ReplyTooLargeError{Store: "etcd", Declared: declared, Limit: limit}
}

// revokeLater revokes leases in the background (an unused grant, the lease
// of a released acquisition): they would expire by themselves, so a failure
// is only logged.
func (l *Locker) revokeLater(ids ...clientv3.LeaseID) {
	if len(ids) == 0 {
		return
	}
	l.bg.Go(func() {
		for _, id := range ids {
			ctx, cancel := context.WithTimeout(l.ctx, l.opts.opTimeout)
			if _, err := l.etcd().Revoke(ctx, id); err != nil && l.ctx.Err() == nil {
				l.log.V(2).Info("Revoking an etcd lease failed; it expires with its TTL", "lease", int64(id), "err", err.Error())
			}
			cancel()
		}
	})
}

// drift is the clock drift allowance of a lease's validity: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// ttlSeconds is the etcd lease TTL for a lease TTL: rounded up to whole
// seconds, so the backend never frees the keys before the TTL.
func ttlSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Key layout. See the package documentation.

// escapeKey encodes a lock key for etcd: bytes outside [A-Za-z0-9._:-]
// become %XX. The result never contains '/' and is injective.
func escapeKey(k string) string {
	const hexdig = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(k))
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexdig[c>>4])
			b.WriteByte(hexdig[c&15])
		}
	}
	return b.String()
}

// unescapeKey reverses escapeKey.
func unescapeKey(e string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(e); i++ {
		if e[i] != '%' {
			b.WriteByte(e[i])
			continue
		}
		if i+2 >= len(e) {
			return "", fmt.Errorf("truncated escape in %q", e)
		}
		v, err := hex.DecodeString(e[i+1 : i+3])
		if err != nil {
			return "", fmt.Errorf("bad escape in %q: %w", e, err)
		}
		b.WriteByte(v[0])
		i += 2
	}
	return b.String(), nil
}

func (l *Locker) holderPrefix() string        { return l.prefix + "h/" }
func (l *Locker) holderKey(k string) string   { return l.holderPrefix() + escapeKey(k) }
func (l *Locker) fenceKey(k string) string    { return l.prefix + "f/" + escapeKey(k) }
func (l *Locker) queueRoot() string           { return l.prefix + "q/" }
func (l *Locker) queuePrefix(k string) string { return l.queueRoot() + escapeKey(k) + "/" }
func (l *Locker) waiterKey(k, tag string) string {
	return l.queuePrefix(k) + tag
}
func (l *Locker) markKey(k, tag string) string {
	return l.prefix + "r/" + escapeKey(k) + "/" + tag
}
func (l *Locker) slotRoot() string           { return l.prefix + "s/" }
func (l *Locker) slotPrefix(k string) string { return l.slotRoot() + escapeKey(k) + "/" }
func (l *Locker) slotKey(k, tag string) string {
	return l.slotPrefix(k) + tag
}

// ownerTag is what etcd stores of an owner token: 128 bits of its SHA-256.
func ownerTag(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// ownerCmps compares key's value to start with the owner's tag: the values
// in ["T ", "T!") are exactly those that start with "T " (' ' < '!').
func ownerCmps(key, tag string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", tag+" "),
		clientv3.Compare(clientv3.Value(key), "<", tag+"!"),
	}
}

// holderRecord is the JSON part of a holder key's value.
type holderRecord struct {
	Holder   string `json:"holder,omitempty"`
	Lease    int64  `json:"lease"`
	TTLMilli int64  `json:"ttlMs"`
	// Acquired is the acquiring client's clock (unix ms): etcd has no clock of its own to offer.
	Acquired int64 `json:"acquiredMs"`
	// Session: Lease is a session, shared by many acquisitions, never
	// revoked for one of them. Records of earlier versions lack it: their
	// etcd lease was granted for that acquisition alone.
	Session bool `json:"session,omitempty"`
	// Attempt is random, so that the value is the acquisition's own: an
	// acquisition whose answer was lost is undone by deleting the keys
	// whose value is still exactly the one it wrote (undoLater).
	Attempt uint64 `json:"attempt,omitempty"`
	// Limit is the semaphore's number of slots the slot was taken with
	// (slot keys only): no acquisition takes the key past it.
	Limit int `json:"limit,omitempty"`
	// Fence is the slot's fencing token once a renewal moved it to another
	// session (slot keys only); until then the token is the slot key's
	// ModRevision, the revision of the transaction that took it.
	Fence int64 `json:"fence,omitempty"`
	// Preempted: a request with Preempt stopped this holding (written
	// over the value in place, on the same etcd lease): it is no longer
	// renewed. A later acquisition writes a new value without it.
	Preempted bool `json:"preempted,omitempty"`
	// Weight is how many of the semaphore's slots the slot takes
	// (Request.Weight; slot keys only). Values of earlier versions lack
	// it: they take one (see slots).
	Weight int `json:"weight,omitempty"`
}

// slots is how many slots a holding takes: its Weight, at least 1.
func (r holderRecord) slots() int { return max(r.Weight, 1) }

// markRecord is the JSON part of a replacement mark's value.
type markRecord struct {
	// By is the holder name of the request with Replace.
	By string `json:"by,omitempty"`
	// Since is the replacing client's clock (unix ms).
	Since int64 `json:"sinceMs"`
}

// slot is one holder of a semaphore key, read from its slot key.
type slot struct {
	tag string
	rec holderRecord
	// token is the slot's fencing token; mod the key's ModRevision.
	token, mod int64
	lease      clientv3.LeaseID
}

// parseSlot reads a slot key.
func parseSlot(kv *mvccpb.KeyValue) (slot, error) {
	var sl slot
	tag, err := decodeValue(kv.Value, &sl.rec)
	if err != nil {
		return sl, err
	}
	sl.tag, sl.mod, sl.lease = tag, kv.ModRevision, clientv3.LeaseID(kv.Lease)
	sl.token = cmp.Or(sl.rec.Fence, kv.ModRevision)
	return sl, nil
}

// parseSlots reads the slot keys of one key, oldest token first.
func parseSlots(kvs []*mvccpb.KeyValue) ([]slot, error) {
	out := make([]slot, 0, len(kvs))
	for _, kv := range kvs {
		sl, err := parseSlot(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, sl)
	}
	slices.SortFunc(out, func(a, b slot) int { return cmp.Compare(a.token, b.token) })
	return out, nil
}

// waiterRecord is the JSON part of a waiter key's value.
type waiterRecord struct {
	Holder string `json:"holder,omitempty"`
	Lease  int64  `json:"lease"`
	// Since is when it joined: its arrival (unix ms; see placeOf), which
	// a waiter keeps when it calls again. Values of earlier versions have
	// the joining client's clock.
	Since int64 `json:"sinceMs"`
	// Weight is how many slots a semaphore waiter asks for
	// (Request.Weight), which the waiters behind it count as ahead of
	// them. Values of earlier versions, and of mutex waiters, lack it:
	// they ask for one (see slots).
	Weight int `json:"weight,omitempty"`
}

// slots is how many slots a waiter asks for: its Weight, at least 1.
func (r waiterRecord) slots() int { return max(r.Weight, 1) }

func encodeValue(tag string, rec any) string {
	b, _ := json.Marshal(rec) // plain structs: cannot fail
	return tag + " " + string(b)
}

// decodeValue splits a stored value into the owner tag and its record.
func decodeValue(v []byte, rec any) (tag string, err error) {
	tag, rest, ok := strings.Cut(string(v), " ")
	if !ok {
		return "", fmt.Errorf("malformed value %q", v)
	}
	if err := json.Unmarshal([]byte(rest), rec); err != nil {
		return "", fmt.Errorf("malformed value %q: %w", v, err)
	}
	return tag, nil
}

// validateLease checks a lease given to Renew or Release.
func validateLease(lease *lock.Lease) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	// A lease without its token (0) names no acquisition: it is not held.
	if lease.Fence < 0 || lease.Fence >= lock.MaxFence {
		return &lock.InvalidRequestError{Field: "lease.fence", Reason: fmt.Sprintf("%d: the fencing token the acquisition returned, in (0, %d)", lease.Fence, lock.MaxFence)}
	}
	return nil
}

// keepAliveOnce refreshes an etcd lease. Unlike unary calls, whose
// interceptor fetches a new auth token and retries when a member rejects
// the token ("invalid auth token": with etcd's simple tokens a member that
// has not applied the authentication yet, or after a token refresh), the
// keepalive stream is not retried by the client; a refresh is idempotent, so
// it is retried here a few times.
func (l *Locker) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	b := wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 4}
	for {
		resp, err := l.etcd().KeepAliveOnce(ctx, id)
		if err == nil || b.Steps <= 1 || ctx.Err() != nil || !tokenRejected(err) {
			return resp, err
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// tokenRejected reports whether a member rejected the client's auth token
// (a new token fixes it).
func tokenRejected(err error) bool {
	return errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision) || errors.Is(err, rpctypes.ErrUserEmpty)
}

// OperationTimeout returns the bound of each operation the Locker was built
// with (its option, or the default).
func (l *Locker) OperationTimeout() time.Duration { return l.opts.opTimeout }
