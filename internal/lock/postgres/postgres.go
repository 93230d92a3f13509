// Package postgres implements lock.Locker on one PostgreSQL database.
//
// # Design
//
// Leases are rows in a table, not session advisory locks: an advisory lock
// dies with the connection that took it (and the operator recycles
// connections, and fails over to another replica), while a lease row lives
// until it is released or expires, and any process that knows the owner
// token renews or releases it, keeping its fencing token. Every operation is
// one call of a PL/pgSQL function (installed by the migrations, see
// sql/0001_leases.sql) in its own transaction: one round trip, like the Redis
// backend's Lua scripts.
//
// Times are the database's: a lease expires at the database's
// clock_timestamp() + TTL, read once the rows are locked. A lease is held
// while its row names an owner and that time has not passed; nothing has to
// delete an expired lease, the next writer overwrites it. The client's
// Lease.Expires is the start of its acquire or renew statement (taken before
// the statement is sent, so before the database reads its clock) + TTL,
// minus a drift allowance of TTL/100 + 2ms: never later than the database's
// expiry while the two clocks run at about the same rate. The call's duration
// is not subtracted again: measuring from the start already accounts for it.
// A call that returns with nothing of that validity left fails instead.
//
// # Tables (in Config.Schema, default "lockwarden")
//
//	locks(key bytea PK, fence, owner, holder, version, acquired, expires, preempted, arrival)
//	    one row per key ever used; owner NULL when released; preempted the
//	    largest token a request with Preempt stopped on the key; arrival
//	    the last waiter's arrival on the key (µs), never going back
//	slots(key, owner, fence, holder, lim, acquired, expires, weight), PK (key, owner)
//	    the holders of semaphores (Limit > 1), one row per holder and key;
//	    weight the slots it takes (Request.Weight, at least 1)
//	waiters(key, owner, ticket, rank, holder, since, deadline, weight), PK (key, owner)
//	    the queues, ordered by rank (arrival less Boost), then ticket;
//	    weight the slots the waiter asks for (1 for a mutex request)
//	replaced(key, owner, until), PK (key, owner)
//	    the owners a request with Replace dropped from a key's queue
//	tickets                       sequence of queue tickets, shared by all keys
//	schema_migrations(version, name, applied_at)
//
// Keys are stored as bytea, the key's exact bytes: no escaping, no encoding
// error for any Go string, no collision between two different keys, and a
// byte-wise order (no collation, which a libc upgrade can change under a text
// index) for the sorted row locking below. Keys are at most MaxKeyBytes.
//
// # Fencing tokens
//
// locks.fence is a durable per-key counter, written in the same transaction
// as the lease: a new lease gets the largest fence of its keys plus one, so
// its token is larger than every token issued before for any of them. Rows
// are never deleted (one small row per key ever used, as the Redis backend
// keeps its counters), and a committed transaction survives a server crash
// (WAL), so tokens never go backwards across restarts, provided the commit
// was flushed before it was acknowledged: every session of the Locker sets
// synchronous_commit = on, whatever the role or database configure (off
// would lose acknowledged leases in a crash, local in a failover), and the
// acquire and renew statements pin it for their transaction too. A server (or
// pooler) that does not keep the setting is refused with an error matching
// ErrSessionSettings (see session.go). Across a failover the standby must
// have every commit: use synchronous replication (synchronous_standby_names);
// an asynchronous standby can lose the last commits, and with them leases and
// tokens already handed out.
//
// # Server-side bounds
//
// Every session sets statement_timeout and idle_in_transaction_session_timeout
// to the operation timeout and lock_timeout to half of it (see session.go): a
// backend whose client gave up (a call's deadline closes the connection, and
// the cancel request pgx then sends may never arrive, from a partitioned
// client say) stops waiting for a row lock, and releases the rows it holds,
// within that bound instead of whenever the row it waits for is released. The migration transaction has its own bounds (migrationTimeout).
// No statement holds a row lock while it waits for the client: each is one
// round trip whose reply (one row; the renewal of a batch one row of arrays,
// the batch bounded by renewBatchRows) fits the server's output buffer, so
// the transaction has committed before anything is written to the socket.
//
// # All-or-nothing and deadlock freedom
//
// A lease on several keys is taken in one transaction. Every function first
// creates the missing rows (INSERT ... ON CONFLICT DO NOTHING, in key order)
// and then locks all the keys' rows with SELECT ... ORDER BY key FOR UPDATE,
// so two requests whose keys overlap take the rows in the same order and
// never deadlock. (Should the server still report a deadlock or a
// serialization failure, the call is retried.)
//
// # Semaphores
//
// A key is held either by a live mutex lease (its locks row) or by live
// slot rows taking up to N slots (Request.Limit N > 1), never both: a mutex
// request is busy while any live slot exists, a semaphore request while a
// live mutex lease exists. Slot rows change only while their key's locks
// row is locked, so the sorted row locking above serializes them too, and a
// multi-key semaphore lease takes its slots of every key or none.
//
// Admission is by weight (Request.Weight, migration 6): each slot row and
// each waiters row keeps the weight of its request (the slots it takes or
// asks for; 1 for a mutex request). A semaphore request of weight w is
// admitted to a key when the weights of the key's live slots, plus the
// weights of the live waiters ahead of it in the queue's order (all of them
// when it is not queued), plus w, are at most the smallest limit among its
// own and the key's live slots' (each slot keeps the limit it was taken
// with, lim): strict FIFO by weight, so a heavy waiter at the head is not
// passed by lighter ones behind it, even while a slot is free. The sums are
// read by the acquire function under the keys' row locks, in the
// transaction that inserts the slot rows, as the counts were before. With
// every weight 1 this is the rule of earlier versions: fewer waiters ahead
// than slots free. HeldError.Holders and Inspect's HolderCount count
// leases, not slots; Inspect reports each one's weight.
//
// A semaphore lease's token comes from locks.fence like a mutex lease's
// (the largest fence of its keys plus one, written back in the same
// transaction), so tokens rise per key across both kinds of holder. A slot
// expires by the database clock like a mutex lease; the next acquisition of
// the key deletes expired slot rows, but nothing depends on it. Renew and
// release find a lease by its owner digest and token in locks or in slots,
// whatever Limit it names now.
//
// Upgrade: migration 6 adds the weight columns with a default of 1, so the
// slots and waiters an older version wrote take and ask for one slot, which
// is what they did. An operator of version 5 still running calls its
// acquire, which goes through the new one with weight 1: it is admitted
// against the weights the new version's leases take.
//
// # Queue and wake-ups
//
// A Request with Queue that finds a key busy inserts (or refreshes) a waiters
// row per key with the same ticket from the tickets sequence and the same
// rank (see Priority below), so multi-key waiters keep one order on every
// key, and a deadline of the database's now + the waiter TTL; a waiter whose
// deadline passed is pruned by the next acquisition of the key. Release, a
// renewal that finds its lease lost, and a Dequeue ahead of others on a key
// with room (no mutex lease, the live slots' weights below their limit)
// send NOTIFY on the channel "<schema>_released" with the key, hex-encoded,
// as payload; the notification is delivered when the transaction commits.
// Each Locker
// keeps one dedicated listening connection (opened on the first Watch or
// waiting Acquire, reconnected with backoff, checked with a round trip when
// idle) that dispatches notifications to Watch channels and waiting Acquire calls. A
// lease that expires without a release sends nothing: Acquire then wakes by a
// timer at the holder's expiry (the database returns its remaining TTL), and
// polls with exponential backoff and jitter as a fallback.
//
// # Queue rules: Replace and Preempt
//
// Both rules are applied by the acquire function (migration 4) in the
// acquisition's transaction, after its row locks and pruning, so they hold
// between every operator sharing the database:
//   - A request with Replace deletes the waiters rows of its keys with a
//     smaller ticket than its own (all of them when it is not queued yet)
//     and inserts, for each dropped owner and key, a replaced row until the
//     database's now + two of the request's waiter TTLs; each key that lost
//     a waiter is notified, so that a waiting Acquire learns it at once. An
//     acquisition whose owner has a live replaced row on one of its keys
//     does nothing else and fails with an error matching lock.ErrReplaced
//     (not lock.ErrNotAcquired). Expired rows are deleted by the next
//     acquisition of the key.
//   - A request with Preempt raises locks.preempted of each of its keys to
//     the largest token of the key's live leases (mutex or slots) of other
//     owners. renew extends none of the keys of a lease whose token is at or
//     below the mark on one of them, releases none, and reports it (minus
//     the key's position), which Renew and RenewAll turn into an error
//     matching lock.ErrPreempted; the lease stays held until its expiry or
//     release, and later leases, with larger tokens, are not affected (the
//     mark is never reset). The owner's own preempted mutex lease no longer
//     leaves the key to a new acquisition of that owner while another owner
//     waits in the key's queue.
//
// A request without the flags pays for them only inside the same statement
// (two index probes of replaced per acquisition, one pruning the ended
// marks and one looking for the caller's; a comparison in renew): no round
// trip is added. The marks are committed rows, durable as leases are: they
// survive a reconnect and a restart of the server, and a failover to a
// synchronous standby. An asynchronous standby can lose the last commits,
// and with them marks as well as leases; a lost mark is set again by the
// next call of the request that set it (a waiting Acquire calls at least
// every third of its waiter TTL), as both rules apply on every call. There
// is one database, so no partition splits a mark: an operator cut off from
// the database can neither set nor read one, and its calls fail with
// lock.ErrBackendUnavailable.
//
// # Priority: Boost
//
// A key's queue is ordered by (rank, ticket): a waiter's rank is its arrival
// less its Request.Boost, in microseconds, drawn by the acquire function
// (migration 5) when the waiter joins, in the transaction that inserts its
// rows, under its keys' row locks, so the order is one rule for every
// operator sharing the database. The arrival is the database's
// clock_timestamp() at the join, or the largest locks.arrival of its keys
// plus one when that is later, and is written back to the keys' rows: it
// never goes back on a key, so equal boosts keep the exact order of
// arrival on every queue, whatever the server's clock does and whichever
// operator calls. A waiter that calls again within its waiter TTL keeps
// its ticket and rank, whatever Boost it brings; the admission to a free
// key or slot, HeldError.Position, Inspect and the wake-up a Dequeue sends
// all count the waiters ahead in that order. Request.Replace still drops
// the waiters with a smaller ticket (that arrived before it), not a smaller
// rank.
//
// There is one clock, the primary's: the operators' clocks play no part.
// A step of it, or a failover to a standby whose clock differs by d, moves
// the arrivals after it by up to d against those before it: a waiter that
// joined before a step back (or on the old primary, when the new one is
// behind) can be passed by a boosted request arriving up to its boost plus
// d after it, and one that joined before a step forward by up to its boost
// minus d; requests with the same boost never pass each other (the last
// arrival of each key is a committed row, replicated with the queue), and
// the bypass is exact again once the clock has caught up with the keys'
// last arrivals.
// An asynchronous standby can lose the last joins, arrivals with them: the
// waiters join again when they call, at their new arrival.
//
// Upgrade: migration 5 gives the waiters queued by an older version the
// time they joined (since) as rank, as if they had joined without a boost,
// and each key the largest of them as its last arrival: they keep their
// order, a request without a boost queues behind them and a boosted one
// passes them by at most its boost. An operator of version 4 still running
// calls its acquire, which goes through the new one with no boost; its
// Inspect lists the queue by ticket until it is gone.
//
// Cost: a request without Boost pays what a boosted one does, inside the
// same statement: its joins write the arrival of its keys' rows (locked
// already) once, and the queue lookups compare (rank, ticket, owner) on the
// waiters_rank index instead of (ticket, owner). No round trip is added.
//
// # Recovery and server failures
//
// A new Locker (a new process) renews and releases a lease an earlier one
// acquired from its Keys and Owner alone: the rows, not the connections, hold
// it. When the server crashes, held leases survive in the table with their
// tokens and keep expiring by the database clock: a holder that renews
// before its TTL runs out (once the server is back) keeps its lease; one that
// could not is lost (ErrLost), never duplicated, since a new holder needs the
// old lease to have expired by the database's clock. While the server is
// unreachable every call fails with an error matching
// lock.ErrBackendUnavailable that wraps a *lock.NodeError naming Host:Port.
//
// # Schema migrations and privileges
//
// The Locker creates and migrates its schema on first use: in one
// transaction under pg_advisory_xact_lock (so operator replicas starting
// together do not race), it creates the schema when missing, then applies the
// migrations newer than the highest version in schema_migrations. A database
// whose schema_migrations holds a version newer than this code knows is
// refused with an error matching ErrSchemaTooNew (an older operator must not
// run against tables a newer one changed).
//
// The role needs CONNECT on the database and CREATE on it (to create the
// schema), nothing else; for example, as an administrator:
//
//	CREATE ROLE lockwarden LOGIN PASSWORD '...';
//	GRANT CONNECT, CREATE ON DATABASE locks TO lockwarden;
//
// Or the administrator creates the schema and lets the role own it, and the
// role needs only CONNECT:
//
//	CREATE SCHEMA lockwarden AUTHORIZATION lockwarden;
//	GRANT CONNECT ON DATABASE locks TO lockwarden;
package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Locker is a lock.Locker on PostgreSQL. It is safe for concurrent use.
type Locker struct {
	cfg                              Config
	opts                             options
	log                              logr.Logger
	pool                             *pgxpool.Pool
	connCfg                          *pgx.ConnConfig // for the listening connection
	endpoint                         string
	schema                           string // the schema name, unquoted
	channel                          string // the NOTIFY channel, unquoted
	sql                              statements
	lock.Renewals                    // Renew and RenewAll, over renewAll
	lock.Acquisitions[time.Duration] // TryAcquire and Acquire, over attempt and wait

	// ctx ends when the Locker is closed: it bounds background work (the
	// migration, the listener).
	ctx    context.Context
	cancel context.CancelFunc

	migrateMu   sync.Mutex
	migrateDone bool          // the schema is current
	migrateRun  *migrationRun // the migration under way, if any

	lis *listener

	closeOnce sync.Once
}

var _ lock.Locker = (*Locker)(nil)

// New builds a Locker. It validates cfg and the options and prepares the
// connection pool, but does not contact the database: connections are made
// on first use, and the schema is created or migrated then. Use Ping to check
// reachability.
func New(cfg Config, opts ...Option) (*Locker, error) {
	o, err := buildOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	cc, err := connConfig(cfg, o)
	if err != nil {
		return nil, err
	}
	pc, err := poolConfig(cc.Copy(), o)
	if err != nil {
		return nil, err
	}
	// No I/O: pgxpool opens connections on first use (MinConns is 0).
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("postgres lock backend: connection pool: %w", err)
	}
	schema := cfg.schema()
	l := &Locker{
		cfg:      cfg,
		opts:     o,
		log:      o.Log.WithValues("backend", "postgres", "endpoint", cfg.endpoint(), "schema", schema),
		pool:     pool,
		connCfg:  cc,
		endpoint: cfg.endpoint(),
		schema:   schema,
		channel:  schema + "_released",
		sql:      newStatements(schema),
	}
	l.Renewals = lock.Renewals{Validate: validateRenew, Batch: l.renewAll}
	l.Acquisitions = lock.Acquisitions[time.Duration]{Check: check, Attempt: l.attempt, Wait: l.wait, Weights: true}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.lis = newListener(l)
	return l, nil
}

// connConfig builds the pgx configuration from cfg field by field. It starts
// from ParseConfig("") (pgx requires configurations to come from it) and
// overwrites everything that the environment (PGHOST, PGOPTIONS, ...) could
// have set, so only cfg decides where and how the Locker connects.
func connConfig(cfg Config, o options) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("postgres lock backend: pgx defaults: %w", err)
	}
	cc.Host = cfg.Host
	cc.Port = uint16(cfg.port()) //nolint:gosec // G115: Validate keeps the port in 1..65535
	cc.Database = cfg.Database
	cc.User = cfg.User
	cc.Password = cfg.Password
	cc.Fallbacks = nil
	cc.TLSConfig = nil
	if cfg.TLS != nil {
		t := cfg.TLS.Clone()
		// sslmode=verify-full: the certificate must name the host we meant.
		if t.ServerName == "" {
			t.ServerName = cfg.Host
		}
		if t.MinVersion == 0 {
			t.MinVersion = tls.VersionTLS12
		}
		cc.TLSConfig = t
	}
	cc.SSLNegotiation = "postgres"
	cc.RequireAuth = ""
	cc.KerberosSrvName, cc.KerberosSpn = "", ""
	cc.ValidateConnect = nil
	// synchronous_commit and the server-side timeouts: set with SET once
	// connected, not as RuntimeParams, so that they survive PgBouncer's
	// session pooling, and read back (see session.go).
	cc.AfterConnect = sessionSetup(sessionSettings(o.opTimeout))
	cc.RuntimeParams = map[string]string{"application_name": "lockwarden"}
	cc.ConnectTimeout = o.opTimeout
	// Dial receives the host as written: the lookup hands it over unresolved
	// (the dialer resolves it, after the operator's policy has seen the name).
	cc.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	dial := cfg.Dial
	if dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		dial = d.DialContext
	}
	cc.DialFunc = pgconn.DialFunc(dial)
	// Every message the server announces larger than MaxReplyBytes fails
	// the connection before anything is allocated for it.
	cc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		f := pgproto3.NewFrontend(r, w)
		f.SetMaxBodyLen(MaxReplyBytes)
		return f
	}
	// A cancelled call interrupts its connection with a deadline at once
	// rather than waiting on a cancel request. pgx then closes the
	// connection, and its close still sends one cancel request, on a new
	// connection through the same Dial (so the dial policy applies) to the
	// address the connection had resolved to. It cannot be relied on (a
	// partitioned or paused client's never arrives): the session's
	// lock_timeout and statement_timeout bound the abandoned backend.
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return cc, nil
}

// withConn runs f on a pooled pgx connection. A connection that f left
// closed (an error, a cancelled call), busy or inside a transaction is
// dropped by the pool when released.
func (l *Locker) withConn(ctx context.Context, f func(ctx context.Context, c *pgx.Conn) error) error {
	c, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(ctx, c.Conn())
}

// Close closes the pool and the listening connection, and ends every Watch.
// It waits for the calls under way (each bounded by the operation timeout)
// to give their connections back. Leases stay in the database until
// released or expired.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		l.lis.close()
		l.pool.Close()
	})
	return nil
}

// Ping checks that the database answers a round trip. The error matches
// lock.ErrBackendUnavailable and names the endpoint.
func (l *Locker) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.opts.opTimeout)
	defer cancel()
	err := l.withConn(ctx, func(ctx context.Context, c *pgx.Conn) error { return c.Ping(ctx) })
	if err != nil {
		return l.unavailable("ping", err)
	}
	return nil
}

// unavailable wraps a database failure so that it matches
// lock.ErrBackendUnavailable and names the endpoint. A message over
// MaxReplyBytes is reported as a *lock.ReplyTooLargeError.
func (l *Locker) unavailable(op string, err error) error {
	var tooLarge *pgproto3.ExceededMaxBodyLenErr
	if errors.As(err, &tooLarge) && !errors.Is(err, lock.ErrReplyTooLarge) {
		err = fmt.Errorf("%w (%w)", &lock.ReplyTooLargeError{Store: "postgres", Declared: int64(tooLarge.ActualBodyLen), Limit: MaxReplyBytes}, err)
	}
	return fmt.Errorf("%w: %s: %w", lock.ErrBackendUnavailable, op, &lock.NodeError{Node: l.endpoint, Err: err})
}

// opContext bounds one operation; for a lease of the given TTL (0: none) at
// most half of it, so that a slow database cannot eat the lease's validity.
func (l *Locker) opContext(ctx context.Context, ttl time.Duration) (context.Context, context.CancelFunc) {
	d := l.opts.opTimeout
	if ttl > 0 {
		d = min(d, ttl/2)
	}
	return context.WithTimeout(ctx, d)
}

// cleanupContext outlives the caller's context (best-effort cleanup after a
// cancelled call) but is bounded by the operation timeout.
func (l *Locker) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), l.opts.opTimeout)
}

// drift is the clock drift allowance of a lease's validity: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// leaseEnd returns the Expires of a lease whose acquire or renew statement
// started at start (before it was sent), and the validity left now, which is
// not positive when the call took all of it.
func (l *Locker) leaseEnd(start time.Time, ttl time.Duration) (time.Time, time.Duration) {
	expires := start.Add(ttl - drift(ttl))
	return expires, l.opts.Until(expires)
}

// retryable reports whether the server aborted the transaction for a reason
// that a new attempt does not meet again: a deadlock (which the sorted row
// locking should prevent) or a serialization failure.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// call runs f (one statement), after making sure the schema is current,
// retrying it when the server aborted it for a deadlock or a serialization
// failure. Errors are wrapped as unavailable.
func (l *Locker) call(ctx context.Context, op string, f func(ctx context.Context, c *pgx.Conn) error) error {
	if err := l.ensureSchema(ctx); err != nil {
		return err
	}
	var err error
	for range 3 {
		err = l.withConn(ctx, func(ctx context.Context, c *pgx.Conn) error {
			if err := l.prepareStatements(ctx, c); err != nil {
				return err
			}
			return f(ctx, c)
		})
		if err == nil || !retryable(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return l.unavailable(op, err)
	}
	return nil
}

// prepareStatements prepares the operations' statements on a connection that has not
// got them yet (once the schema exists; pgx answers from its map when they
// are there), named by their SQL text so that pgx uses them for those texts.
// It costs one round trip per statement on a new
// connection, before any lease call on it, instead of one before the first
// use of each: a call then takes one round trip from the start, which is
// what Lease.Expires is measured from.
func (l *Locker) prepareStatements(ctx context.Context, c *pgx.Conn) error {
	for _, q := range []string{l.sql.acquire, l.sql.renew, l.sql.release, l.sql.dequeue, l.sql.inspect} {
		if _, err := c.Prepare(ctx, q, q); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
	}
	return nil
}

// encodeKeys returns the keys as the database stores them: their bytes.
func encodeKeys(keys []string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// validateKeys checks a key list given outside a Request, and every key
// against MaxKeyBytes.
func validateKeys(field string, keys []string) error {
	if err := lock.ValidateKeyList(field, keys); err != nil {
		return err
	}
	return validateKeyLengths(field, keys)
}

func validateKeyLengths(field string, keys []string) error {
	for i, k := range keys {
		if len(k) > MaxKeyBytes {
			return &lock.InvalidRequestError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("key of %d bytes is longer than the %d bytes this backend stores", len(k), MaxKeyBytes)}
		}
	}
	return nil
}

// validateText checks a string stored in a text column: PostgreSQL refuses
// NUL bytes and invalid UTF-8, and the request must fail as invalid before
// any I/O rather than as a database error.
func validateText(field, s string) error {
	if !utf8.ValidString(s) {
		return &lock.InvalidRequestError{Field: field, Reason: "must be valid UTF-8"}
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return &lock.InvalidRequestError{Field: field, Reason: "must not contain a NUL byte"}
		}
	}
	return nil
}

// validateLease checks a lease given to Renew or Release.
func validateLease(lease *lock.Lease) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	if err := validateText("lease.owner", lease.Owner); err != nil {
		return err
	}
	return validateKeyLengths("lease.keys", lease.Keys)
}

// OperationTimeout returns the bound of each operation the Locker was built
// with (its option, or the default).
func (l *Locker) OperationTimeout() time.Duration { return l.opts.opTimeout }
