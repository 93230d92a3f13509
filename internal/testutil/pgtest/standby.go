package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/jackc/pgx/v5"
)

// ReplicationUser is the role (REPLICATION LOGIN, the password of User) a
// standby started with ReplicateVia streams as.
const ReplicationUser = "replicator"

// StandbyOption configures a standby started by StartStandby.
type StandbyOption func(*standbyConfig)

type standbyConfig struct {
	via string
}

// ReplicateVia makes the standby stream from addr (host:port, a proxy to
// the primary's Addr, say) over TCP as ReplicationUser, instead of from the
// primary's private socket: so that a test can cut, black-hole or slow the
// replication link and let the standby fall behind.
func ReplicateVia(addr string) StandbyOption { return func(c *standbyConfig) { c.via = addr } }

// replicationTimeout bounds how long a standby may take to stream from its
// primary, and a primary to see its synchronous standby.
const replicationTimeout = 60 * time.Second

// StartStandby starts a hot standby of primary that streams its WAL
// (physical streaming replication): a base backup taken with pg_basebackup
// -R through the primary's private socket as the superuser (the replication
// entry of pg_hba.conf; wal_level=replica and max_wal_senders are
// PostgreSQL's defaults), started on a port of its own with the primary's
// settings, and returned once its WAL receiver streams. It has the
// primary's database, role and password; it is read-only until Promote. It
// is killed when t ends. The standby is asynchronous until the primary
// names it in synchronous_standby_names (SetSynchronousStandbys).
func StartStandby(t testing.TB, primary *Server, opts ...StandbyOption) *Server {
	t.Helper()
	Require(t)
	var sc standbyConfig
	for _, o := range opts {
		o(&sc)
	}
	s, err := launchStandby(primary, sc)
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("PostgreSQL standby log (%s):\n%s", s.Addr, s.LogTail(40))
			}
			s.Close()
		})
	}
	if err != nil {
		t.Fatalf("pgtest: standby of %s: %v", primary.Addr, err)
	}
	return s
}

func launchStandby(p *Server, sc standbyConfig) (*Server, error) {
	cfg := p.cfg
	cfg.settings = slices.Clone(cfg.settings)
	if sc.via != "" {
		host, port, err := net.SplitHostPort(sc.via)
		if err != nil {
			return nil, fmt.Errorf("ReplicateVia(%q): %w", sc.via, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), replicationTimeout)
		defer cancel()
		var exists bool
		if err := p.superuserQuery(ctx, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = "+quote(ReplicationUser)+")", &exists); err != nil {
			return nil, fmt.Errorf("look up the replication role on %s: %w", p.Addr, err)
		}
		if !exists {
			create := fmt.Sprintf("CREATE ROLE %s REPLICATION LOGIN PASSWORD %s", pgx.Identifier{ReplicationUser}.Sanitize(), quote(p.Password))
			if err := p.superuserExec(ctx, create); err != nil {
				return nil, fmt.Errorf("create the replication role on %s: %w", p.Addr, err)
			}
		}
		sslmode := "disable"
		if cfg.tls {
			sslmode = "require"
		}
		// Overrides the primary_conninfo that pg_basebackup -R writes.
		cfg.settings = append(cfg.settings, fmt.Sprintf("primary_conninfo=host=%s port=%s user=%s password=%s sslmode=%s application_name=standby",
			host, port, ReplicationUser, conninfoQuote(p.Password), sslmode))
	}
	s := &Server{cfg: cfg, bin: p.bin, cred: p.cred, Host: p.Host, Database: p.Database, User: p.User, Password: p.Password, CAPEM: p.CAPEM}
	if err := s.makeRoot("pgtest-standby-"); err != nil {
		return s, err
	}
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		return s, err
	}
	for _, d := range []string{s.root, s.sock} {
		if err := s.chown(d); err != nil {
			return s, err
		}
	}
	// The backup copies the primary's data directory, its pg_hba.conf and
	// TLS files included, and writes standby.signal and primary_conninfo
	// (-R) for the primary's socket.
	cmd := exec.Command(filepath.Join(s.bin, "pg_basebackup"),
		"-h", p.sock, "-p", strconv.Itoa(p.Port), "-U", "postgres",
		"-D", s.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	cmd.Dir = s.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return s, fmt.Errorf("pg_basebackup: %w: %s", err, out)
	}
	if err := s.launchOnFreePort(); err != nil {
		return s, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicationTimeout)
	defer cancel()
	if err := s.pollSuperuser(ctx, "SELECT status = 'streaming' FROM pg_stat_wal_receiver"); err != nil {
		return s, fmt.Errorf("the standby on %s does not stream from %s: %w", s.Addr, p.Addr, err)
	}
	return s, nil
}

// conninfoQuote quotes v as a libpq connection string value.
func conninfoQuote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(v) + "'"
}

// pollSuperuser runs query (one boolean) as the superuser until it returns
// true or ctx ends.
func (s *Server) pollSuperuser(ctx context.Context, query string) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var ok bool
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		last = s.superuserQuery(pctx, query, &ok)
		return last == nil && ok, nil
	})
	if err != nil {
		if last != nil {
			return fmt.Errorf("%w (last: %w)", err, last)
		}
		return fmt.Errorf("%s stayed false: %w", query, err)
	}
	return nil
}

// superuserQuery runs query as the superuser in Database and scans its one
// row into dest; ctx bounds it.
func (s *Server) superuserQuery(ctx context.Context, query string, dest ...any) error {
	c, err := s.SuperuserConn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.QueryRow(ctx, query).Scan(dest...)
}

// SetSynchronousStandbys sets the primary's synchronous_standby_names
// (ALTER SYSTEM, then a reload) and, when names is not empty, returns once
// a standby replicates synchronously: from then on a commit with
// synchronous_commit = on returns only once the standby flushed it. Empty
// names makes replication asynchronous again.
func (s *Server) SetSynchronousStandbys(names string) error {
	ctx, cancel := context.WithTimeout(context.Background(), replicationTimeout)
	defer cancel()
	if err := s.superuserExec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quote(names)); err != nil {
		return fmt.Errorf("set synchronous_standby_names on %s: %w", s.Addr, err)
	}
	if err := s.superuserExec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload %s: %w", s.Addr, err)
	}
	if names == "" {
		return nil
	}
	if err := s.pollSuperuser(ctx, "SELECT current_setting('synchronous_standby_names') = "+quote(names)+
		" AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming')"); err != nil {
		return fmt.Errorf("no synchronous standby on %s: %w", s.Addr, err)
	}
	return nil
}

// Promote promotes a standby (pg_promote) and returns once it has left
// recovery and accepts writes.
func (s *Server) Promote() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var ok bool
	if err := s.superuserQuery(ctx, "SELECT pg_promote(true, 60)", &ok); err != nil {
		return fmt.Errorf("promote %s: %w", s.Addr, err)
	}
	if !ok {
		return fmt.Errorf("promote %s: pg_promote did not finish within 60s", s.Addr)
	}
	if err := s.pollSuperuser(ctx, "SELECT NOT pg_is_in_recovery()"); err != nil {
		return fmt.Errorf("promote %s: %w", s.Addr, err)
	}
	return nil
}
