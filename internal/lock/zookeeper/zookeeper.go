// Package zookeeper implements lock.Locker on an Apache ZooKeeper ensemble
// (3.5 or newer), with the classic recipe: ephemeral nodes that vanish with a
// crashed holder's session, a queue of ephemeral waiter nodes (FIFO, or by
// arrival less Request.Boost: see Priority) in which each waiter watches only
// the node ahead of it, and multi-key leases taken in one transaction (multi), so a lease holds all its keys or none and two
// multi-key requests never deadlock. A key is held by one lease (a mutex:
// Request.Limit 0 or 1) or by leases whose weights (Request.Weight: the
// slots each takes) sum to at most Limit (a counting semaphore: Limit > 1),
// each with its own fencing token.
//
// # Nodes
//
// For Config.Root R (default /lockwarden) and a lock key K:
//
//	R/ticket                  data unused: its mtime is the ensemble's clock
//	                          (see below); its mzxid was the queue's ticket
//	                          counter before R/arrival
//	R/arrival                 data: the last arrival but one handed out (µs,
//	                          decimal); written by every join, its mzxid is
//	                          the joiner's ticket (see Priority)
//	R/keys/k-<enc K>          one persistent node per key ever used; data
//	                          (JSON): K, and after a recovery move the lease's
//	                          token. Every acquisition and every move writes
//	                          it, so its version says whether the holder node
//	                          is still the one a Locker read or wrote, and its
//	                          mzxid is the token of the last acquisition
//	R/keys/k-<enc K>/holder   EPHEMERAL: the mutex lease on K. Data (JSON):
//	                          owner (a hash of the owner token), holder,
//	                          session (its renewal node), ttlMs, and after a
//	                          recovery move fence and acquired
//	R/keys/k-<enc K>/slot-<owner hash>
//	                          EPHEMERAL: one semaphore lease on K (one per
//	                          owner and key), data as a holder node's plus
//	                          limit, the Request.Limit it was taken with,
//	                          and weight, the slots it takes (Request.Slots;
//	                          absent in the previous release's: one)
//	R/sessions/s-<session id>-<TTL ms>
//	                          EPHEMERAL: a renewal node, one per Locker and
//	                          TTL; its mtime is the last renewal of every
//	                          lease on it (see session.go)
//	R/keys/k-<enc K>/w-<rank>-<ticket>-<owner hash>
//	                          EPHEMERAL: one queued waiter; data: owner hash,
//	                          holder, weight (the slots it asks for; absent
//	                          in the previous release's: one). The place is
//	                          the rank and ticket in the name (19 digits
//	                          each), not a sequence number, so
//	                          the node can be moved into another session under
//	                          the same name (see Queue); an earlier release's
//	                          are w-<ticket>-<owner hash> (see Priority)
//	R/keys/k-<enc K>/r-<owner hash>
//	                          persistent: a replacement mark, the owner's
//	                          waiter was dropped by a request with Replace;
//	                          data: holder, by (the replacing holder), ttlMs
//	                          (see Replace and Preempt)
//
// <enc K> is K with every byte outside [A-Za-z0-9._:-] written %XX (so '/'
// creates no hierarchy and two keys never share a node), behind a "k-" that
// keeps names clear of ".", ".." and "zookeeper". The owner token itself is
// never stored: nodes carry the first 128 bits of its SHA-256 in hex, so
// reading the nodes does not let anyone renew or release a lease.
//
// # Acquisition and fencing
//
// An acquisition reads the key nodes' children (holder, slots and queue),
// then runs one multi that, for every key, creates the lease's node (the
// holder node of a mutex, the owner's slot node of a semaphore) and sets the
// key node's data at the version it read. The version checks fail if anyone
// acquired a key (or moved a lease of it) in between, so the acquisitions of
// a key are serialized and what the read counted is exact at commit; the
// creates fail if a node of that name appeared anyway. The fencing token is
// the multi's zxid (the key node's new mzxid, equal to the created node's
// czxid): zxids are the ensemble's total order of writes, strictly
// increasing across leader elections (a new epoch in the high 32 bits), so a
// token is larger than every token issued before for any key, by anyone,
// mutex or slot. The last token of a free key is its key node's mzxid, which
// releases do not change (after a recovery move: the token in its data).
//
// # Semaphores
//
// A mutex request (Limit 0 or 1) finds a key free when no live lease of
// another owner holds it, holder or slot; a semaphore request (Limit N > 1)
// when no live holder node of another owner does and the weights of the
// live slots of other owners plus its own weight (Request.Slots) are at
// most the bound: the smallest Limit of the request's and theirs (each slot
// node records its Limit and weight), so no holder shares a key with more
// slots taken than its own Limit allows. The waiters come first (see
// Queue): the weights of the live waiters ahead of the request (every live
// waiter when it is not queued) count as taken. A mutex lease and a mutex
// request take one slot. An owner's own holder or slot node does not
// count: its acquisition replaces it (so an owner holds at most one node
// per key, of either kind, and taking the key again with another weight
// counts the new weight only). The acquisition's multi writes the key node
// at the version read, so the slots and weights it counted are the ones
// held at commit. Slot nodes hang on the renewal node as holder
// nodes do, so everything below (TTL timers, expiry on the ensemble's clock,
// recovery moves, release) treats "the lease's node on a key" alike, holder
// or slot (below, "holder node" means either); and Release and Renew of a
// lease given with its token find its node of either kind, whatever Limit
// they are given (a lock's maxHolders may change while it is held). Without a
// token, the kind its Limit names.
//
// # TTL and sessions
//
// A renewal is one write for all the leases of a Locker and TTL: the leases
// are held on a renewal node, and a lease lives until TTL after the later of
// its holder node's and its renewal node's last writes (mtime). RenewAll
// writes the renewal node and then only reads the holder nodes to check that
// they are still the ones it wrote; session.go says why that is safe, and
// how a holder node written by an earlier release (its own ttlMs, no renewal
// node) is moved onto one. Below, "a holder node's TTL passed" means this.
//
// ZooKeeper has no per-node TTL for ephemeral nodes, so the Locker enforces
// the lease TTL itself: a timer per acquisition (keyed by its fencing token,
// so two leases of one owner each keep their own) deletes, when the TTL
// passes without a renewal, exactly the holder nodes it was armed for: at the
// key node's and the holder node's versions this Locker last wrote, in one
// checked transaction. (Acquisitions of other slots write the key node too:
// a slot node that check misses is read, after the key node, and deleted at
// the key node's version just read when its creation zxid and version are
// still the ones this Locker wrote.) A node renewed, moved into another session or created
// by a later acquisition (of the same owner too) since is never deleted by
// an older timer; a renewal stops the timer before it writes the renewal
// node, and one that finds the timer already firing takes the read path and
// races with it on the holder node's version: it wins if its write commits
// first, else it reports the lease lost. The timer keeps trying
// while the ensemble is unreachable, also past the session timeout (a quorum
// loss does not expire sessions: a new leader gives each a fresh timeout).
//
// The ensemble ends no lease at its TTL by itself, so acquirers do too: a
// TryAcquire that finds another owner's holder node whose TTL passed on the
// ensemble's clock (its end as above, plus the drift allowance, before the
// mtime of a node the acquirer just wrote) treats the key as free (a slot as
// free) and deletes the node, at the version read, in its acquisition
// transaction, which also checks the renewal node at the version read. So a key is not held past its TTL for longer than it takes
// the next acquirer to look, whether the holder's Locker is gone (closed, or
// crashed before its session timed out) or its timer could not reach the
// ensemble. Nor does a renewal revive such a lease: once the timer could not
// reach the ensemble, renewals read the nodes, and a holder node past its
// TTL on the ensemble's clock, in any session, is reported lost. If
// the process dies, the session expires after the negotiated session timeout
// and the ensemble deletes the nodes. Lease.Expires is therefore the start of
// the acquire or renew round trip plus min(TTL, negotiated session timeout),
// minus a drift margin: after a partition the ensemble may expire the session
// that long after the last contact. When the session expires every lease held
// on it is gone: Renew reports lock.ErrLost (the nodes are gone, or another
// owner's). So the lease of a crashed holder ends after the session timeout,
// not at its TTL (Inspect's Expires, the TTL on the ensemble's clock, may then
// be past while the key is still held). Close drops the connection without
// closing the session, so the leases stay (as the lock.Locker contract says)
// until a new Locker renews or releases them or the session times out.
//
// # Recovery
//
// A new Locker (a new session) renews a lease an older one acquired by moving
// its holder nodes into its own session in one multi: write the key node at
// the version read, delete the old holder node at the version read, create it
// again with the same data plus the lease's fence and acquisition time. The lease
// keeps its token and its place, and nobody ever sees the key free. A lease
// whose TTL passed on the ensemble's clock (its holder node's mtime plus the
// TTL it was written with is before the mtime of a node written now) is not
// moved or renewed but released, and Renew reports lock.ErrLost: the Locker
// that would have ended it at its TTL is gone (its session not timed out
// yet), or could not reach the ensemble in time. Release
// from any Locker deletes the holder nodes whose owner hash and fencing token
// match (a lease given without its token: any of the owner's); when all
// it found were such expired nodes it reports lock.ErrNotHeld, as for a lease
// that is gone.
//
// # Queue
//
// A queued request (Request.Queue) that cannot take its keys joins the queue
// of every key with one ticket, the mzxid of its write to R/arrival, and one
// rank (see Priority): one global order, so a multi-key waiter has the same
// place in every queue and no two waiters can each be ahead of the other.
// Waiter node names sort by rank, then ticket: the queue's order.
// Calling TryAcquire again refreshes the waiter nodes (setData), which moves
// their mtime. A waiter node of another session (queued through an earlier
// Locker: before an operator restart or failover) is refreshed by moving it
// into the caller's session in one multi: delete it at the version read and
// create it again under the same name. The name carries the ticket, so the
// waiter keeps its place; left in the old session it would vanish when that
// session times out, and the waiter would queue again at the back. (The
// nodes stay ephemeral rather than persistent with a deadline: a waiter whose
// Locker crashed and is never restarted leaves with its session, and a live
// one is always in the session of the Locker that last refreshed it.) The
// next acquirer deletes, at the version it read, waiters
// whose mtime is older than WaiterTTL before the mtime of a node it just
// wrote, so dead waiters are pruned by the ensemble's clock, never the
// client's. A waiter takes a key only while the weights of the live waiters
// ahead of it and its own fit in the free slots (one for a free mutex; with
// weight 1 everywhere: the waiters ahead are fewer than the free slots), so
// the first free slots go to the best-ranked waiters, and a heavy waiter is
// never passed by lighter ones behind it, even while a slot is free: it
// waits only for holders to release. Each waiter node stores its weight,
// rewritten by every refresh (a waiter that calls again with another weight
// keeps its place with the new weight). Acquire waits on a ZooKeeper watch:
// at the head of the queue, on a node whose deletion makes room (the holder node, or a
// slot of another owner), else on the live waiter just ahead of it, so a
// release wakes one waiter, not the herd (a request without Queue watches
// such a node, or the head of the queue that blocks it); exponential
// backoff with jitter is the fallback.
//
// A Locker remembers the versions it wrote for the leases it holds, so its
// own renewals and releases are one multi without reads (check the key node's
// version, write or delete the holder node at its version); when anything
// changed in between the check fails and it falls back to reading.
//
// # Priority
//
// A waiter's rank is its arrival less its Request.Boost, in microseconds:
// the queue is ordered by rank, then ticket, so a boosted waiter goes ahead
// of those that arrived less than its boost before it, and equal boosts keep
// arrival order. The arrival is the ensemble's clock at the join, made
// monotonic by the arrival node: a join writes R/arrival at the version it
// knows, and its arrival is max(last + 1, the write's mtime in µs), where
// last, the previous arrival, is what the node's data and mtime say (the
// data is the arrival of the write before: max(data + 1, mtime)). The
// version check serializes the joins of every Locker sharing the ensemble,
// so arrivals grow with tickets, and the rank comes from the clock of the
// leader, where the queue lives; the waiter nodes then carry it in their
// names. A write that finds another version (another Locker joined since)
// reads the node and writes again; a Locker that joined last writes at the
// version it knows without reading. So a join costs what it did before
// ranks, one write of a counter node (R/ticket then) and the multi that
// creates the waiter nodes, plus a read and a write when another Locker
// joined since (or for a Locker's first join), again for each join that
// wins the race meanwhile. A refresh keeps the name, so the rank: a waiter
// that calls again keeps its place whatever boost it asks for. Requests
// that do not queue never touch the arrival node. Replace compares
// tickets, not ranks: it drops the waiters that arrived before it.
//
// Clock skew between the servers: the rank uses the clock of the leader
// that committed the join. After an election to a leader whose clock is
// behind, arrivals go on from the last one (1 µs apart) until its clock
// catches up, so equal boosts keep their order and a boost is measured
// against a clock that stood still for the difference; a leader whose clock
// is ahead makes the waiters that joined before the election look earlier
// by the difference, which shortens the head start of a boosted waiter
// against them by as much (never the order of equal boosts). Within the
// skew allowance (see Consistency) that is milliseconds against boosts of
// seconds to a day.
//
// Upgrades: a waiter node an earlier release made (w-<ticket>-<owner hash>)
// ranks by its ticket, a zxid (the election epoch times 2^32 plus a
// counter), far below any arrival in microseconds since 1970, so the
// waiters queued before the upgrade are served first, in ticket order, then
// the ranked ones. An earlier release reads a ranked name as
// w-<ticket>-<hash> with the rank as its ticket, so during a rolling upgrade
// both releases see the same order; it never recognizes such a node as its
// owner's, so an operator rolled back queues its waiters again (the old
// nodes are pruned after the waiter TTL). A legacy waiter that calls again
// through this release keeps its name, so its place.
//
// Upgrades and weights: slot and waiter nodes the previous release wrote
// have no weight in their data and take one slot, as they did. The previous
// release ignores the weight it does not know and counts every slot and
// waiter as one, so it may admit more slots than the limit beside a lease of
// weight above 1: ask for weights above 1 only once every Locker sharing the
// ensemble runs this release (weight 1 is counted the same by both).
//
// # Replace and Preempt
//
// The queue rules Request.Replace and Request.Preempt are written into the
// nodes by the attempt that applies them, in one multi at the versions it
// read, so they hold between every Locker sharing the ensemble.
//
// A request with Replace, once it has joined or refreshed its place (so its
// ticket is known; one that finds its keys free while others wait joins
// first, as any queued request), treats the live waiters of other owners
// with a smaller ticket on its keys (all of them when it is not queued) as
// gone. If it is still refused, one multi deletes their waiter nodes and
// creates (or, over a mark past its time, rewrites) a replacement mark
// r-<owner hash> for each dropped owner; if the keys are free it takes them
// with the same operations in its acquisition multi. Waiters that joined
// after it have larger tickets and stay. Every attempt already lists the key
// nodes' children, so it sees its owner's mark without another round trip;
// a mark whose last write (mtime) plus its TTL (twice the waiter TTL of the
// Locker that wrote it, or of the reader when that is longer) plus the skew
// allowance is not before the ensemble's clock (one write of R/ticket, made
// only by an owner that has a mark) fails the attempt with lock.ErrReplaced,
// which does not match lock.ErrNotAcquired. Marks past their time are
// deleted at the version read by the next acquirer of the key. Marks are
// persistent nodes, so they survive the dropped waiter's session (an
// operator restart) and every failover; a key nobody uses again keeps its
// last marks (a few bytes each) until someone does.
//
// A request with Preempt that is refused also sets Preempted in the holder
// and slot nodes of other owners on its keys (holderData.Preempted), each at
// the version read, with the key node's version read checked in the same
// multi: a lease taken after the read writes the key node, so it is never
// preempted, and a lease already preempted is left as it is. The same write
// takes the node off its renewal node (session empty, ttlMs its TTL): its
// end on the ensemble's clock becomes TTL after the preemption's write, no
// earlier than it was (the renewal node was last written before), so the
// lease is never shortened, and the renewals of its Locker's other leases,
// one write of the shared renewal node, no longer extend it. The write also
// moves the node's version, which is the check a renewal meets: the fast
// path reads every holder node after writing the renewal node and sends a
// changed one to the read path, and the read path's rewrite is checked at
// the version it knows; the read path then finds Preempted and fails with
// lock.ErrPreempted (after lock.ErrLost's checks) without writing, moving or
// releasing anything. A renewal whose write committed before the preemption
// extended the lease before the preemption, as the contract allows. Release
// deletes a preempted node as any other, and the acquisition's TTL timer
// still ends it at its TTL: it deletes a node whose only change since it was
// armed is the preemption's write. While others wait, a preempted lease
// leaves no room to its own owner, so the owner cannot escape by taking the
// key again (which would replace the node with an unpreempted one).
//
// Failover and partitions: marks and the Preempted flag are ordinary znodes
// written by quorum-committed multis. A leader election keeps every
// committed write, so no mark is lost or half-applied; a server cut off from
// the quorum commits nothing, so a partitioned minority can neither drop
// waiters nor preempt, and a Locker connected to it gets errors
// (lock.ErrBackendUnavailable) until it reaches the quorum. Reads from a
// lagging follower may miss a mark: a busy key is read again after a sync
// before the answer, and a dropped waiter's own next write (its refresh or
// its acquisition, which deletes its waiter node) fails on the missing node
// and makes it read again; ZooKeeper's per-session order means a Locker
// never reads a state older than its own last write. The Preempted flag
// lives in the lease's ephemeral node and ends with it (release, timer,
// session expiry); a mark ends on the ensemble's clock, with the skew
// allowance below.
//
// # Consistency
//
// The ensemble's clock is the wall clock of the leader that committed a
// write (a node's mtime and ctime). Lease expiry on the ensemble's clock
// (acquirers taking a holder past its TTL, recovery renewals refusing one)
// and waiter pruning compare an mtime written by one leader with the mtime of
// a node written now, possibly by another leader after an election. The
// package assumes that the servers' clocks agree within the drift allowance
// (1% of the TTL plus 2ms; NTP-synchronized hosts agree far better): a
// server whose clock runs ahead by more could let an acquirer take a key
// before its holder's Lease.Expires. ZooKeeper offers no clock of its own
// that survives an election (zxids order writes but say nothing of time), so
// the assumption cannot be removed without giving up expiry at the TTL.
//
// ZooKeeper serves reads from the server a client is connected to, which may
// lag the leader. Every decision to write is validated by the write itself
// (versions, create-if-absent); an answer that a key is busy or not held is
// given only after a sync, so another client's release or acquisition that
// returned before is always seen.
package zookeeper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Locker is a lock.Locker on ZooKeeper. It is safe for concurrent use.
type Locker struct {
	cfg  Config
	opts options
	log  logr.Logger

	root, keysPath, ticketPath string
	arrivalPath                string
	arrival                    arrivalClock // what this Locker knows of arrivalPath (state.go)
	sessionsPath               string
	sess                       sessions // renewal nodes created (session.go)
	acl                        []zk.ACL
	servers                    string // for error messages
	lock.Renewals                     // Renew and RenewAll, over renewAll
	lock.Acquisitions[string]         // TryAcquire and Acquire, over attempt and wait

	conn   *zk.Conn
	dialer *trackingDialer
	// negotiatedMs is the session timeout the ensemble granted (0 until known).
	negotiatedMs atomic.Int64

	ctx    context.Context // ends with Close: background goroutines stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	readyMu sync.Mutex
	isReady atomic.Bool
	parents sync.Map // key node path -> struct{}: known to exist

	timersMu sync.Mutex
	// timers are the TTL timers, one per acquisition: by fencing token, or
	// by a negative number (unconfirmedSeq counts them down) for an
	// acquisition whose outcome is unknown.
	timers         map[int64]*leaseTimer
	unconfirmedSeq int64

	// afterExpire, when set (tests only), runs when a TTL timer's work is done.
	afterExpire func(hash string)
	// beforeTake, when set (tests only), runs before an acquisition's
	// transaction; skipRenewalCheck (tests only: a mutant the tests must
	// catch) leaves out its check of the renewal nodes read; noRenewalNode
	// (tests only) renews every lease by the read path, as before renewal
	// nodes.
	beforeTake func()
	// beforePolicies, when set (tests only), runs before the transaction
	// of a refused request's queue rules (policyOps).
	beforePolicies   func()
	skipRenewalCheck bool
	noRenewalNode    bool
	// ignoreSlots (tests only: a mutant the semaphore tests must catch)
	// admits a semaphore request whatever slots other owners hold.
	ignoreSlots bool

	// sessionSubs are told (non-blocking, buffer 1) when the client
	// established a session again after a disconnection: the all-keys
	// watches resync (see watcher.resync).
	subsMu      sync.Mutex
	sessionSubs map[chan struct{}]struct{}
	hadSession  atomic.Bool
}

var _ lock.Locker = (*Locker)(nil)

// New builds a Locker. It validates cfg and the options and starts connecting
// in the background; it does no blocking network I/O. Use Ping to check that
// the ensemble answers.
func New(cfg Config, opts ...Option) (*Locker, error) {
	o, err := buildOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	l := &Locker{
		cfg:     cfg,
		opts:    o,
		log:     o.Log,
		root:    cfg.root(),
		servers: strings.Join(cfg.Servers, ","),
		timers:  map[int64]*leaseTimer{},
	}
	l.Renewals = lock.Renewals{Validate: validateRenew, Batch: l.renewAll}
	l.Acquisitions = lock.Acquisitions[string]{Attempt: l.attempt, Wait: l.wait, Weights: true}
	l.keysPath = l.root + "/keys"
	l.ticketPath = l.root + "/ticket"
	l.arrivalPath = l.root + "/arrival"
	l.sessionsPath = l.root + "/sessions"
	l.acl = zk.WorldACL(zk.PermAll)
	if cfg.Digest != "" {
		user, pass, _ := strings.Cut(cfg.Digest, ":")
		l.acl = zk.DigestACL(zk.PermAll, user, pass)
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	dial := cfg.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	l.dialer = &trackingDialer{dial: dial, conns: map[net.Conn]struct{}{}, handshakeTimeout: cfg.sessionTimeout()}
	conn, _, err := zk.Connect(cfg.Servers, cfg.sessionTimeout(),
		zk.WithDialer(l.dialer.zkDial),
		// The client's own bound, for the packets of a session (the
		// dialer's frameConn bounds every packet, the connect response
		// included, before the client sees it).
		zk.WithMaxBufferSize(MaxReplyBytes),
		// The configured addresses go to Dial as they are: the default host
		// provider would resolve them first, blocking New and hiding the
		// names from a policy-enforcing dialer.
		zk.WithHostProvider(&staticHosts{}),
		zk.WithLogger(zkLogger{l}),
		// Info lines carry the negotiated session timeout (see zkLogger).
		zk.WithLogInfo(true),
		zk.WithEventCallback(l.onEvent),
	)
	if err != nil {
		l.cancel()
		return nil, fmt.Errorf("zookeeper client: %w", err)
	}
	l.conn = conn
	return l, nil
}

// Close stops the Locker's timers and goroutines and drops its connection
// without closing the ZooKeeper session: held leases stay until they are
// released or renewed by another Locker, or the session times out. Leases are
// no longer ended at their TTL by this Locker after Close. It may take up to
// a second: the client waits that long for an answer to its own shutdown.
func (l *Locker) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	l.cancel()
	l.timersMu.Lock()
	for k, t := range l.timers {
		t.timer()
		delete(l.timers, k)
	}
	l.timersMu.Unlock()
	// Cut the connection first so the client cannot send closeSession (which
	// would delete every ephemeral node, that is release every lease), then
	// stop the client.
	l.dialer.closeAll()
	l.conn.Close()
	l.wg.Wait()
	return nil
}

// Ping checks that the ensemble answers (one read round trip).
func (l *Locker) Ping(ctx context.Context) error {
	_, err := call(ctx, l, func(c *zk.Conn) (bool, error) {
		ok, _, err := c.Exists("/")
		return ok, err
	})
	if err != nil {
		return l.unavailable("ping", err)
	}
	return nil
}

// SessionTimeout returns the session timeout the ensemble granted, or the one
// asked for while no session was established yet.
func (l *Locker) SessionTimeout() time.Duration {
	if ms := l.negotiatedMs.Load(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return l.cfg.sessionTimeout()
}

func (l *Locker) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateExpired:
		l.log.V(2).Info("ZooKeeper session expired: every lease held on it is lost", "server", ev.Server)
	case zk.StateHasSession:
		// l.conn is not read here: the client reports its first session
		// before zk.Connect has returned it to New.
		l.log.V(2).Info("ZooKeeper session established", "server", ev.Server)
		if l.hadSession.Swap(true) {
			l.notifyReconnect()
		}
	case zk.StateDisconnected:
		l.log.V(2).Info("Disconnected from ZooKeeper", "server", ev.Server)
	}
}

// subscribeReconnect returns a channel that receives when the client
// establishes a session again (the same one or a new one) after a
// disconnection, and the function that unsubscribes it.
func (l *Locker) subscribeReconnect() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.subsMu.Lock()
	if l.sessionSubs == nil {
		l.sessionSubs = map[chan struct{}]struct{}{}
	}
	l.sessionSubs[ch] = struct{}{}
	l.subsMu.Unlock()
	return ch, func() {
		l.subsMu.Lock()
		delete(l.sessionSubs, ch)
		l.subsMu.Unlock()
	}
}

func (l *Locker) notifyReconnect() {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	for ch := range l.sessionSubs {
		select {
		case ch <- struct{}{}:
		default: // a resync is pending already
		}
	}
}

// zkLogger passes the client's log lines to the Locker's logger at V(5) and
// learns the negotiated session timeout from the line the client prints when
// a session is established (the client does not export it otherwise).
type zkLogger struct{ l *Locker }

// authenticatedFormat is the client's log format for an established session
// (github.com/go-zookeeper/zk v1.0.4, conn.go).
const authenticatedFormat = "authenticated: id=%d, timeout=%d"

// Printf implements zk.Logger.
func (z zkLogger) Printf(format string, args ...any) {
	if format == authenticatedFormat && len(args) == 2 {
		if ms, ok := args[1].(int32); ok && ms > 0 {
			z.l.negotiatedMs.Store(int64(ms))
		}
	}
	if v := z.l.log.V(5); v.Enabled() {
		v.Info("zk: " + fmt.Sprintf(format, args...))
	}
}

// trackingDialer opens connections with the configured Dial and remembers
// them, so that Close can cut them; after Close it refuses to dial. Every
// connection is a frameConn: no packet over MaxReplyBytes, and the connect
// response within handshakeTimeout.
type trackingDialer struct {
	dial             func(ctx context.Context, network, address string) (net.Conn, error)
	handshakeTimeout time.Duration
	mu               sync.Mutex
	done             bool
	conns            map[net.Conn]struct{}

	// tooLarge is the last packet refused, until a later connection gets
	// a packet through: the cause behind the failures that follow.
	tooLarge atomic.Pointer[lock.ReplyTooLargeError]
}

var errLockerClosed = errors.New("the zookeeper Locker is closed")

func (d *trackingDialer) zkDial(network, address string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		return nil, errLockerClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := d.dial(ctx, network, address)
	if err != nil {
		return nil, err
	}
	fc, err := newFrameConn(c, MaxReplyBytes, time.Now().Add(d.handshakeTimeout), d.tooLarge.Store, func() {
		if d.tooLarge.Load() != nil {
			d.tooLarge.Store(nil)
		}
	})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		_ = c.Close()
		return nil, errLockerClosed
	}
	tc := &trackedConn{Conn: fc, d: d}
	d.conns[tc] = struct{}{}
	return tc, nil
}

func (d *trackingDialer) closeAll() {
	d.mu.Lock()
	d.done = true
	conns := d.conns
	d.conns = map[net.Conn]struct{}{}
	d.mu.Unlock()
	for c := range conns {
		_ = c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	d    *trackingDialer
	once sync.Once
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		delete(c.d.conns, c)
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}

// staticHosts is a zk.HostProvider that hands out the configured addresses
// round robin, unresolved.
type staticHosts struct {
	mu      sync.Mutex
	servers []string
	next    int // index of the next server to try
	tried   int // servers tried since the last successful connection
}

// Init takes the configured servers (zk.HostProvider).
func (h *staticHosts) Init(servers []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	// zk.Connect has shuffled them already, so clients spread over the members.
	h.servers = append([]string(nil), servers...)
	return nil
}

// Len returns the number of servers (zk.HostProvider).
func (h *staticHosts) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.servers)
}

// Next returns the next server; retryStart is true once every server was
// tried without a connection (the client then waits a second).
func (h *staticHosts) Next() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.servers[h.next]
	h.next = (h.next + 1) % len(h.servers)
	retry := h.tried >= len(h.servers)
	if retry {
		h.tried = 0
	}
	h.tried++
	return s, retry
}

// Connected records a successful connection (zk.HostProvider).
func (h *staticHosts) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tried = 0
}

// errTimeout marks a request that got no answer within the operation timeout.
var errTimeout = errors.New("no answer within the operation timeout")

// call runs one ZooKeeper request under the operation timeout (and ctx). The
// client cannot cancel a request: on timeout its answer is dropped.
func call[T any](ctx context.Context, l *Locker, fn func(c *zk.Conn) (T, error)) (T, error) {
	var zero T
	if l.closed.Load() {
		return zero, errLockerClosed
	}
	if err := l.ready(ctx); err != nil {
		return zero, err
	}
	return rawCall(ctx, l, fn)
}

func rawCall[T any](ctx context.Context, l *Locker, fn func(c *zk.Conn) (T, error)) (T, error) {
	var zero T
	ctx, cancel := context.WithTimeout(ctx, l.opts.opTimeout)
	defer cancel()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() {
		v, err := fn(l.conn)
		ch <- res{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return zero, fmt.Errorf("%w (%v): %w", errTimeout, l.opts.opTimeout, ctx.Err())
		}
		return zero, ctx.Err()
	}
}

// ready authenticates the session (once: the client re-sends the credentials
// on every reconnect) and creates the Root, keys, ticket, arrival and
// sessions nodes.
func (l *Locker) ready(ctx context.Context) error {
	if l.isReady.Load() {
		return nil // every call passes here: no lock once ready
	}
	l.readyMu.Lock()
	defer l.readyMu.Unlock()
	if l.isReady.Load() {
		return nil
	}
	if l.cfg.Digest != "" {
		if _, err := rawCall(ctx, l, func(c *zk.Conn) (struct{}, error) {
			return struct{}{}, c.AddAuth("digest", []byte(l.cfg.Digest))
		}); err != nil {
			return fmt.Errorf("digest authentication: %w", err)
		}
	}
	for _, p := range append(ancestors(l.root), l.root, l.keysPath, l.ticketPath, l.arrivalPath, l.sessionsPath) {
		if err := l.createPersistent(ctx, p, nil); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	l.isReady.Store(true)
	return nil
}

// ancestors returns the proper ancestors of p, outermost first ("/" excluded).
func ancestors(p string) []string {
	var out []string
	for i := 1; i < len(p); i++ {
		if p[i] == '/' {
			out = append(out, p[:i])
		}
	}
	return out
}

// createPersistent creates a persistent node unless it exists.
func (l *Locker) createPersistent(ctx context.Context, p string, data []byte) error {
	_, err := rawCall(ctx, l, func(c *zk.Conn) (string, error) {
		return c.Create(p, data, 0, l.acl)
	})
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	return nil
}

// ensureKeyNodes creates the key nodes that are not known to exist.
func (l *Locker) ensureKeyNodes(ctx context.Context, keys []string) error {
	var missing []string
	for _, k := range keys {
		if _, ok := l.parents.Load(l.keyPath(k)); !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := l.ready(ctx); err != nil {
		return err
	}
	errs := parallel(len(missing), func(i int) error {
		p := l.keyPath(missing[i])
		if err := l.createPersistent(ctx, p, keyNodeData(missing[i], 0)); err != nil {
			return err
		}
		l.parents.Store(p, struct{}{})
		return nil
	})
	return errors.Join(errs...)
}

// parallel runs fn(0..n-1) concurrently (the requests share the session's
// connection, so they are pipelined) and returns the errors by index.
func parallel(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	if n == 1 {
		errs[0] = fn(0)
		return errs
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errs
}

// unavailable wraps a failure to talk to ZooKeeper as lock.ErrBackendUnavailable.
func (l *Locker) unavailable(op string, err error) error {
	node := l.servers
	if s := l.conn.Server(); s != "" {
		node = s
	}
	if tooLarge := l.dialer.tooLarge.Load(); tooLarge != nil && !errors.Is(err, lock.ErrReplyTooLarge) {
		// The client only logs why it dropped a connection; its callers
		// see timeouts or a closed connection. Name the cause.
		err = fmt.Errorf("%w; the client dropped its connection: %w", err, tooLarge)
	}
	return fmt.Errorf("%w: %s: %w", lock.ErrBackendUnavailable, op, &lock.NodeError{Node: node, Err: err})
}

// Paths and names. See the package documentation.

func (l *Locker) keyPath(key string) string { return l.keysPath + "/" + encodeKey(key) }

func (l *Locker) holderPath(key string) string { return l.keyPath(key) + "/" + holderName }

// nodePath is the path of the node name (a holder or slot node) of key.
func (l *Locker) nodePath(key, name string) string { return l.keyPath(key) + "/" + name }

const (
	holderName     = "holder"
	slotPrefix     = "slot-"
	keyPrefix      = "k-"
	waiterPrefix   = "w-"
	replacedPrefix = "r-"
)

// replacedName is the name of the replacement mark of the owner hash on a
// key: a request with Replace dropped that owner's waiter node (see the
// package documentation, Replace and Preempt).
func replacedName(hash string) string { return replacedPrefix + hash }

// parseReplaced returns the owner hash of a replacement mark's name; ok is
// false for other names.
func parseReplaced(name string) (hash string, ok bool) {
	hash, ok = strings.CutPrefix(name, replacedPrefix)
	return hash, ok && hash != ""
}

// slotName is the name of the slot node of the owner hash (one per owner
// and key: an owner acquiring again replaces it, as a holder node).
func slotName(hash string) string { return slotPrefix + hash }

// leaseNodeName is the node a request with limit takes on each key: the
// holder node for a mutex (limit 0 or 1), the owner's slot node for a
// semaphore.
func leaseNodeName(limit int, hash string) string {
	if limit > 1 {
		return slotName(hash)
	}
	return holderName
}

// isLeaseNode tells whether a key node's child named name is a lease's
// node: the holder node or a slot node.
func isLeaseNode(name string) bool {
	return name == holderName || strings.HasPrefix(name, slotPrefix) && len(name) > len(slotPrefix)
}

// encodeKey turns a lock key into one znode name: "k-" and the key with
// every byte outside [A-Za-z0-9._:-] (and '%' itself) written as %XX. The
// encoding is injective, so two keys never share a node, and the name is
// never ".", "..", "zookeeper" or anything with '/' or a control character.
func encodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(keyPrefix) + len(key))
	b.WriteString(keyPrefix)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-' {
			b.WriteByte(c)
			continue
		}
		const hexDigits = "0123456789ABCDEF"
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// decodeKey reverses encodeKey; ok is false for a name encodeKey never makes.
func decodeKey(name string) (string, bool) {
	s, ok := strings.CutPrefix(name, keyPrefix)
	if !ok {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		v, err := hex.DecodeString(s[i+1 : i+3])
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] {
			return "", false
		}
		b.WriteByte(v[0])
		i += 2
	}
	if encodeKey(b.String()) != name {
		return "", false
	}
	return b.String(), true
}

// ownerHash is what the nodes store instead of the owner token: the first
// 128 bits of its SHA-256, hex encoded.
func ownerHash(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// waiterName is the name of a waiter node: rank, ticket (both zero-padded,
// so names sort by rank, then ticket) and owner hash.
func waiterName(rank, ticket int64, hash string) string {
	return fmt.Sprintf("%s%019d-%019d-%s", waiterPrefix, rank, ticket, hash)
}

// legacyWaiterName is the name of a waiter node an earlier release makes:
// ticket and owner hash, no rank.
func legacyWaiterName(ticket int64, hash string) string {
	return fmt.Sprintf("%s%019d-%s", waiterPrefix, ticket, hash)
}

// parseWaiter splits a waiter node name; ok is false for other names.
func parseWaiter(name string) (ticket int64, hash string, ok bool) {
	_, ticket, hash, ok = parseRanked(name)
	return ticket, hash, ok
}

// parseRanked splits a waiter node name (waiterName, or legacyWaiterName,
// whose rank is its ticket: see the package documentation, Priority); ok
// is false for other names.
func parseRanked(name string) (rank, ticket int64, hash string, ok bool) {
	rest, found := strings.CutPrefix(name, waiterPrefix)
	if !found {
		return 0, 0, "", false
	}
	first, rest, found := cutNumber(rest)
	if !found {
		return 0, 0, "", false
	}
	if second, h, found := cutNumber(rest); found {
		return first, second, h, validHash(h)
	}
	return first, first, rest, validHash(rest)
}

// cutNumber splits "<19 digits>-<rest>" into the number and the rest; found
// is false when s does not start so.
func cutNumber(s string) (n int64, rest string, found bool) {
	if len(s) < 21 || s[19] != '-' {
		return 0, "", false
	}
	for _, c := range s[:19] {
		if c < '0' || c > '9' {
			return 0, "", false
		}
	}
	n, err := strconv.ParseInt(s[:19], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return n, s[20:], true
}

// validHash tells whether the end of a waiter node name can be an owner
// hash: not empty, no '-'.
func validHash(h string) bool { return h != "" && !strings.Contains(h, "-") }

// drift is the clock drift allowance on a lease's validity: 1% plus 2ms.
func drift(d time.Duration) time.Duration { return d/100 + 2*time.Millisecond }

// validity is how long after the start of a successful acquire or renew round
// trip the holder may rely on the lease: the TTL, but never past when the
// ensemble may expire the session after its last contact, minus drift.
func (l *Locker) validity(ttl time.Duration) time.Duration {
	v := min(ttl, l.SessionTimeout())
	return v - drift(v)
}

// cleanupContext outlives the caller's context (best-effort cleanup after a
// cancelled call) but is bounded by the operation timeout.
func (l *Locker) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*l.opts.opTimeout)
}

// OperationTimeout returns the bound of each operation the Locker was built
// with (its option, or the default).
func (l *Locker) OperationTimeout() time.Duration { return l.opts.opTimeout }
