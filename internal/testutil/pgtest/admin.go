package pgtest

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SuperuserConn opens a pgx connection as the superuser to Database through
// the server's private Unix socket (never through a proxy in front of its
// TCP port): an administrator's session for tests that break things on
// purpose over more than one statement (hold row locks in an open
// transaction, terminate the code under test's backends). The caller closes
// it; ctx bounds the connect.
func (s *Server) SuperuserConn(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database, cfg.Password = s.sock, uint16(s.Port), "postgres", Database, "" //nolint:gosec // G115: a port freeport handed out
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	cfg.ConnectTimeout = probeTimeout
	cfg.RuntimeParams = map[string]string{"application_name": "pgtest-admin"}
	return pgx.ConnectConfig(ctx, cfg)
}
