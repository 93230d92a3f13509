package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// maxIdle closes connections idle longer than this (the server may have
	// a shorter idle timeout of its own); the pool's health check looks
	// every healthCheckPeriod.
	maxIdle           = 5 * time.Minute
	healthCheckPeriod = time.Minute
	// maxLifetime replaces a connection after about this long (plus up to
	// maxLifetimeJitter, so they are not all replaced at once).
	maxLifetime       = time.Hour
	maxLifetimeJitter = 5 * time.Minute
	// pingAfter: a connection idle longer than this is pinged before use,
	// since a server restart or a dropped route closes nothing on our side.
	pingAfter = 5 * time.Second
)

// poolConfig builds the pgxpool configuration: the connections are cc's (see
// connConfig), at most o.maxConns of them, opened on demand (none by New),
// pinged before use when idle for pingAfter, closed when idle for maxIdle.
// pgxpool.ParseConfig reads the environment (PGSERVICE can even set
// pool_* parameters), so every pool setting is overwritten here, and the
// connection configuration is replaced by cc, which ignores the environment.
func poolConfig(cc *pgx.ConnConfig, o options) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("postgres lock backend: pgxpool defaults: %w", err)
	}
	pc.ConnConfig = cc
	pc.MaxConns = int32(o.maxConns) //nolint:gosec // G115: buildOptions keeps it in 1..math.MaxInt32
	pc.MinConns, pc.MinIdleConns = 0, 0
	pc.MaxConnIdleTime = maxIdle
	pc.MaxConnLifetime, pc.MaxConnLifetimeJitter = maxLifetime, maxLifetimeJitter
	pc.HealthCheckPeriod = healthCheckPeriod
	// The ping is bounded by the caller's deadline (every call has one: the
	// operation timeout) and, when it ends, by the context watcher, which
	// closes the connection instead of sending a cancel request.
	pc.PingTimeout = o.opTimeout
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > pingAfter }
	return pc, nil
}
