package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Session settings. Every connection the Locker opens (the pool's and the
// listening one) sets these right after it is established, whatever the
// server, the database or the role (ALTER ROLE ... SET) configured:
//
//	synchronous_commit                  on
//	statement_timeout                   the operation timeout
//	lock_timeout                        half the operation timeout
//	idle_in_transaction_session_timeout the operation timeout
//
// synchronous_commit = on: a lease is acknowledged only once its commit is
// flushed to the WAL (and, with synchronous_standby_names set, to a
// synchronous standby). With off, a crash loses acquisitions (and renewals)
// the caller was told about, and the next owner gets the same fencing token
// while the first still holds; with local, a failover to the synchronous
// standby does the same. The acquire and renew statements also pin it for
// their own transaction (set_config(..., true)), so that it holds at commit
// even if something reset the session.
//
// The timeouts are server-side bounds. A call's own deadline (the operation
// timeout, at most half the lease TTL) closes the client's connection, which
// a backend waiting for a row lock does not notice; pgx also sends a cancel
// request on a new connection then, but that one never arrives from a client
// that is partitioned from the server, paused, or whose dialer refuses it.
// Without lock_timeout such a backend would keep waiting, holding the rows of
// the keys it locked before, for as long as whoever holds the row it waits
// for (another client paused or partitioned in an open transaction, a session
// of an administrator) keeps it. lock_timeout is half the operation timeout so that a wait for a row
// fails with its own error (55P03 lock_not_available) before the statement
// as a whole runs into statement_timeout (57014), the bound of everything
// else a statement does. idle_in_transaction_session_timeout ends a session
// left idle inside a transaction (a paused client between the statements of
// the migration), releasing its locks. No statement of the Locker runs longer
// than its client waits, so none of these cuts a call short that would have
// succeeded.
//
// They are set with SET after connecting rather than as startup parameters
// (pgx's RuntimeParams): PgBouncer refuses startup parameters it does not
// track ("unsupported startup parameter") or, with ignore_startup_parameters,
// drops them silently, while a SET on a session-pooled connection reaches the
// server connection that stays with this client until it disconnects
// (server_reset_query runs only then), so the settings survive PgBouncer's
// session pooling. They are read back in a second round trip: a pooler in
// transaction or statement mode (whose next statement may run on a server
// connection that never saw the SET) or a proxy that swallows SET is then
// found, usually, and the connection is refused with a *SessionSettingError.
// Transaction and statement pooling are not supported.

// ErrSessionSettings is matched (errors.Is) by every *SessionSettingError:
// the server, or a pooler in front of it, does not keep a setting the Locker
// relies on. The error of every call then matches lock.ErrBackendUnavailable
// too: the backend cannot be used safely until the setup is fixed.
var ErrSessionSettings = errors.New("postgres server does not keep the lock engine's session settings")

// SessionSettingError is a connection the Locker refused because a session
// setting it depends on (see the package documentation) could not be set or
// does not read back as set.
type SessionSettingError struct {
	// Setting is the setting's name, for example synchronous_commit; empty
	// when setting them failed as a whole (see Err).
	Setting string
	// Want is the value the Locker set, as pg_settings reports it (timeouts
	// in milliseconds).
	Want string
	// Got is the value the server reported after the SET; empty when it
	// reported none.
	Got string
	// Err is the server's refusal of the SET or of the read-back, if that
	// is what happened.
	Err error
}

// Error says which setting did not hold and what that risks.
func (e *SessionSettingError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("postgres session settings: the server refused to set or report them (%v): the lock backend needs PostgreSQL, directly or through a pooler in session mode", e.Err)
	}
	got := strconv.Quote(e.Got)
	if e.Got == "" {
		got = "nothing"
	}
	return fmt.Sprintf("postgres session setting %s reads back as %s after SET %s = %s: %s; the server, or a pooler in front of it, does not keep the session's settings (connect directly or through a pooler in session mode, not transaction or statement mode)",
		e.Setting, got, e.Setting, e.Want, settingRisk(e.Setting))
}

// Is makes a SessionSettingError match ErrSessionSettings.
func (e *SessionSettingError) Is(target error) bool { return target == ErrSessionSettings }

// Unwrap returns the server's refusal, if any.
func (e *SessionSettingError) Unwrap() error { return e.Err }

func settingRisk(name string) string {
	switch name {
	case "synchronous_commit":
		return "commits would not wait for the WAL flush (or the synchronous standby), so a crash or failover could lose acknowledged acquisitions and issue their fencing tokens again"
	case "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout":
		return "a stalled session could hold the rows of its keys, and wedge them, without a server-side bound"
	default:
		return "the lock backend depends on it"
	}
}

// sessionSetting is one session setting and its value as pg_settings.setting
// reports it (timeouts in milliseconds, their base unit).
type sessionSetting struct {
	name, value string
}

// sessionSettings returns the settings for an operation timeout, in the
// order they are checked (durability first).
func sessionSettings(opTimeout time.Duration) []sessionSetting {
	return []sessionSetting{
		{"synchronous_commit", "on"},
		{"statement_timeout", millis(opTimeout)},
		{"lock_timeout", millis(opTimeout / 2)},
		{"idle_in_transaction_session_timeout", millis(opTimeout)},
	}
}

// millis is d in whole milliseconds, rounded up, at least 1 (0 would
// disable a timeout) and at most what the server accepts (INT_MAX ms).
func millis(d time.Duration) string {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(min(max(ms, 1), math.MaxInt32)), 10)
}

// sessionSetup returns the AfterConnect hook that sets the settings on a new
// connection and checks them in a second round trip. A server that refuses
// or does not keep them fails the connection with a *SessionSettingError; a
// failure of the connection itself is returned as it is.
func sessionSetup(settings []sessionSetting) pgconn.AfterConnectFunc {
	// The names and values are constants and integers: nothing to quote.
	var set strings.Builder
	names := make([]string, len(settings))
	for i, s := range settings {
		fmt.Fprintf(&set, "SET %s = %s; ", s.name, s.value)
		names[i] = "'" + s.name + "'"
	}
	readBack := "SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN (" + strings.Join(names, ", ") + ")"
	return func(ctx context.Context, pc *pgconn.PgConn) error {
		if _, err := pc.Exec(ctx, set.String()).ReadAll(); err != nil {
			return sessionErr(err)
		}
		res, err := pc.Exec(ctx, readBack).ReadAll()
		if err != nil {
			return sessionErr(err)
		}
		got := map[string]string{}
		for _, r := range res {
			for _, row := range r.Rows {
				if len(row) == 2 {
					got[string(row[0])] = string(row[1])
				}
			}
		}
		for _, s := range settings {
			if got[s.name] != s.value {
				return &SessionSettingError{Setting: s.name, Want: s.value, Got: got[s.name]}
			}
		}
		return nil
	}
}

// sessionErr classifies a failure of the setup: the server's answer (an
// error reply) means it refuses the settings; anything else is the
// connection failing, reported as it is.
func sessionErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return &SessionSettingError{Err: err}
	}
	return fmt.Errorf("set up the session: %w", err)
}
