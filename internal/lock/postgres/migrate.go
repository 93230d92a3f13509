package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// ErrSchemaTooNew is matched by the error of every call on a database whose
// schema was migrated by a newer version of this code than the running one.
// The error matches lock.ErrBackendUnavailable too: the backend cannot be used.
var ErrSchemaTooNew = errors.New("lock schema is newer than this code")

// migrationFiles are the migrations, sql/NNNN_name.sql, applied in NNNN order.
// A released migration is never edited: a change is a new file.
//
//go:embed sql/*.sql
var migrationFiles embed.FS

// advisoryClass is the first key of the advisory lock that serializes the
// migrations of one schema ("lwmg"); the second is hashtext(schema).
const advisoryClass = 0x6c776d67

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	ents, err := migrationFiles.ReadDir("sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range ents {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration file %s: want sql/NNNN_name.sql", e.Name())
		}
		b, err := migrationFiles.ReadFile(path.Join("sql", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1, 2, 3, ... without gaps: found %d at position %d", m.version, i+1)
		}
	}
	return out, nil
}

// LatestSchemaVersion is the schema version this code migrates to.
func LatestSchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// render substitutes the schema (a quoted identifier) and the NOTIFY channel
// (a string literal) into a migration. Both come from a schema name that
// Config.Validate restricted to [a-z0-9_], so neither can break out.
func render(sql, schema, channel string) string {
	return strings.NewReplacer(
		"{{schema}}", pgx.Identifier{schema}.Sanitize(),
		"{{channel}}", "'"+channel+"'",
	).Replace(sql)
}

// migrationRun is one migration attempt; err is set before done is closed.
type migrationRun struct {
	done chan struct{}
	err  error
}

// ensureSchema makes sure the schema is current, once per Locker. The first
// call starts the migration in the background, bounded by migrationTimeout
// rather than by the caller's (maybe short) deadline, and every call waits
// for it or for its own context; a failed migration is retried by the next call.
func (l *Locker) ensureSchema(ctx context.Context) error {
	l.migrateMu.Lock()
	if l.migrateDone {
		l.migrateMu.Unlock()
		return nil
	}
	run := l.migrateRun
	if run == nil {
		run = &migrationRun{done: make(chan struct{})}
		l.migrateRun = run
		go func() {
			mctx, cancel := context.WithTimeout(l.ctx, migrationTimeout)
			defer cancel()
			err := l.migrate(mctx)
			l.migrateMu.Lock()
			l.migrateDone = err == nil
			l.migrateRun = nil
			l.migrateMu.Unlock()
			run.err = err
			close(run.done)
		}()
	}
	l.migrateMu.Unlock()
	select {
	case <-run.done:
	case <-ctx.Done():
		return l.unavailable("migrate the lock schema", ctx.Err())
	}
	switch {
	case run.err == nil:
		return nil
	case errors.Is(run.err, ErrSchemaTooNew):
		return fmt.Errorf("%w: %w", lock.ErrBackendUnavailable, run.err)
	default:
		return l.unavailable("migrate the lock schema", run.err)
	}
}

// migrate brings the schema to LatestSchemaVersion in one transaction.
func (l *Locker) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	return l.withConn(ctx, func(ctx context.Context, c *pgx.Conn) error { return l.migrateOn(ctx, c, ms) })
}

// migrateOn runs the migration transaction on c.
func (l *Locker) migrateOn(ctx context.Context, c *pgx.Conn, ms []migration) error {
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Server-side bounds of the transaction (see migrationTimeout): the
	// session's statement_timeout and lock_timeout (the operation timeout)
	// are too short to wait for another replica's migration.
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.set_config('statement_timeout', $1, true), pg_catalog.set_config('lock_timeout', $1, true)",
		millis(migrationTimeout)); err != nil {
		return fmt.Errorf("bound the migration: %w", err)
	}
	// Two replicas starting together: the second waits here, then finds the
	// schema current.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", int32(advisoryClass), l.schema); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	// From here on the transaction may take table locks (a migration that
	// alters a table), and every lease call on the table would queue behind
	// a DDL statement waiting for one: it waits no longer than a call would.
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.set_config('lock_timeout', $1, true)", millis(l.opts.opTimeout/2)); err != nil {
		return fmt.Errorf("bound the migration: %w", err)
	}
	ident := pgx.Identifier{l.schema}.Sanitize()
	var haveSchema, haveTable bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
		to_regclass($2) IS NOT NULL`, l.schema, ident+".schema_migrations").Scan(&haveSchema, &haveTable)
	if err != nil {
		return fmt.Errorf("look for the schema: %w", err)
	}
	// CREATE SCHEMA IF NOT EXISTS would need CREATE on the database even
	// when the schema exists (an administrator may have created it).
	if !haveSchema {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
			return fmt.Errorf("create schema %s (the role needs CREATE on the database, or an administrator creates the schema): %w", l.schema, err)
		}
	}
	if !haveTable {
		if _, err := tx.Exec(ctx, "CREATE TABLE "+ident+`.schema_migrations (
			version    int PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create %s.schema_migrations: %w", l.schema, err)
		}
	}
	var current int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+ident+".schema_migrations").Scan(&current); err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	latest := ms[len(ms)-1].version
	if current > latest {
		return fmt.Errorf("%w: schema %q of database %q is at version %d, this code knows versions up to %d: upgrade lockwarden (or point it at another schema)",
			ErrSchemaTooNew, l.schema, l.cfg.Database, current, latest)
	}
	for _, m := range ms[current:] {
		if _, err := tx.Exec(ctx, render(m.sql, l.schema, l.channel)); err != nil {
			return fmt.Errorf("apply migration %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+ident+".schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return fmt.Errorf("record migration %d: %w", m.version, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit the migrations: %w", err)
	}
	if current < latest {
		l.log.Info("Migrated the lock schema", "from", current, "to", latest)
	}
	return nil
}

// migrationTimeout bounds the migration transaction: it may wait for
// another replica's migration. It is the client's deadline and, on the
// server, the transaction's statement_timeout and its lock_timeout while it
// waits for the migration lock (half the operation timeout after, for its
// DDL); between its statements the session's
// idle_in_transaction_session_timeout (the operation timeout) applies, so a
// client paused or cut off mid-migration loses the transaction, and its
// locks, within that time.
const migrationTimeout = 30 * time.Second

// syncCommitPin sets synchronous_commit = on for the rest of the statement's
// transaction (is_local): evaluated in the statement's output, before the
// commit that reads it.
const syncCommitPin = "pg_catalog.set_config('synchronous_commit', 'on', true)"

// statements are the SQL texts of the operations, for one schema.
type statements struct {
	acquire, renew, release, dequeue, inspect string
}

func newStatements(schema string) statements {
	s := pgx.Identifier{schema}.Sanitize()
	return statements{
		// acquire and renew pin synchronous_commit for their own transaction
		// (the session sets it too, see session.go): the commit, after the
		// statement, waits for the WAL flush whatever reset the session.
		acquire: "SELECT o_ok, o_fence, o_busy, o_busy_holder, o_busy_fence, o_position, o_waiters, o_holder_ttl_ms, o_busy_holders, o_replaced, " +
			syncCommitPin + " FROM " + s + ".acquire($1, $2, $3, $4, $5, $6, $7, $8::int, $9::boolean, $10::boolean, $11::bigint, $12::int)",
		// One row, of arrays (lease numbers and results, in the same order):
		// the reply of a batch of renewBatchRows keys is about 1 KiB, far
		// below the server's 8 KiB output buffer, so nothing reaches the
		// socket before the transaction has committed and released its row
		// locks; a client that stops reading holds no lock (a row per lease
		// would be written, and could block, while they are held).
		renew: "SELECT coalesce(array_agg(r.o_lease ORDER BY r.o_lease), '{}'), coalesce(array_agg(r.o_lost ORDER BY r.o_lease), '{}'), " +
			syncCommitPin + " FROM " + s + ".renew($1, $2, $3, $4, $5) r",
		release: "SELECT " + s + ".release($1, $2, $3)",
		dequeue: "SELECT " + s + ".dequeue($1, $2)",
		// One row per requested key, in request order: the mutex lease
		// (when live) or the last fence, the live semaphore slots (the
		// oldest $3, by fence, with their weights, and their number), the
		// head of the queue (in its order: rank, then ticket) and the
		// number of waiters in it (live waiters only: a deadline not
		// passed, the rule acquire prunes by).
		inspect: `WITH t AS (SELECT clock_timestamp() AS now)
SELECT l.owner IS NOT NULL AND l.expires > t.now AS held,
       coalesce(l.holder, ''), coalesce(l.fence, 0), l.acquired, l.expires,
       coalesce(sl.holders, '{}'), coalesce(sl.fences, '{}'), coalesce(sl.acquired, '{}'), coalesce(sl.expires, '{}'),
       coalesce(sl.weights, '{}'), c.slots,
       coalesce(w.holders, '{}'), coalesce(w.sinces, '{}'), n.queued
FROM unnest($1::bytea[]) WITH ORDINALITY AS u(key, ord)
CROSS JOIN t
LEFT JOIN ` + s + `.locks l ON l.key = u.key
LEFT JOIN LATERAL (
	SELECT array_agg(q.holder ORDER BY q.fence) AS holders, array_agg(q.fence ORDER BY q.fence) AS fences,
	       array_agg(q.acquired ORDER BY q.fence) AS acquired, array_agg(q.expires ORDER BY q.fence) AS expires,
	       array_agg(q.weight ORDER BY q.fence) AS weights
	FROM (SELECT x.holder, x.fence, x.acquired, x.expires, x.weight FROM ` + s + `.slots x
	      WHERE x.key = u.key AND x.expires > t.now
	      ORDER BY x.fence LIMIT $3) q
) sl ON true
CROSS JOIN LATERAL (
	SELECT count(*)::int AS slots FROM ` + s + `.slots x
	WHERE x.key = u.key AND x.expires > t.now
) c
LEFT JOIN LATERAL (
	SELECT array_agg(q.holder ORDER BY q.rank, q.ticket, q.owner) AS holders,
	       array_agg(q.since ORDER BY q.rank, q.ticket, q.owner) AS sinces
	FROM (SELECT x.holder, x.since, x.rank, x.ticket, x.owner FROM ` + s + `.waiters x
	      WHERE x.key = u.key AND x.deadline >= t.now
	      ORDER BY x.rank, x.ticket, x.owner LIMIT $2) q
) w ON true
CROSS JOIN LATERAL (
	SELECT count(*)::int AS queued FROM ` + s + `.waiters x
	WHERE x.key = u.key AND x.deadline >= t.now
) n
ORDER BY u.ord`,
	}
}
