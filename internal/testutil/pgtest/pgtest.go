// Package pgtest starts real PostgreSQL servers for tests.
//
// Every server is a postmaster started from the Debian/Ubuntu PostgreSQL
// binaries (never the system service), with its own data directory, a free
// loopback TCP port (package freeport) and a private Unix socket directory.
// It is killed when the test ends, and the tail of its log is printed when
// the test failed. A server can be killed (SIGKILL to the postmaster and all
// its backends at once, like a crash), restarted with its data (crash
// recovery from the WAL), paused (SIGSTOP) and resumed (SIGCONT), so tests can
// inject the faults a lease backend has to survive.
//
// Each server has a database and a login role for the code under test that
// holds only CONNECT and CREATE on that database (what the lock backend
// documents as its minimal grants), reachable over TCP with scram-sha-256
// password authentication (TLS-only with WithTLS). The superuser "postgres"
// is reachable only through the private Unix socket, for the harness itself
// (and for streaming replication to a standby, StartStandby); a standby
// started with ReplicateVia streams over TCP as ReplicationUser instead.
//
// With -short every test that starts a server is skipped. When the binaries
// are missing the test is skipped with the install command, or fails when
// LOCKWARDEN_REQUIRE_SERVERS is set (CI must not pass silently). The binaries
// are looked up in $LOCKWARDEN_PG_BINDIR, then `pg_config --bindir`, then the
// newest /usr/lib/postgresql/*/bin.
//
// Tests run as root on CI machines, and PostgreSQL refuses to run as root:
// then initdb and postgres run as the "postgres" system user, in a directory
// made under os.TempDir() that it owns (t.TempDir() parents are 0700 root,
// which that user cannot traverse), removed when the test ends.
package pgtest

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/testutil/faketime"
	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/proc"
	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

const (
	// InstallHint says how to get the server binaries.
	InstallHint = "run hack/ensure-postgres.sh (or: sudo apt-get install postgresql), or set LOCKWARDEN_PG_BINDIR to the directory holding initdb and postgres"
	// Database is the database the code under test uses.
	Database = "lockwarden"
	// User is the login role the code under test uses: CONNECT and CREATE on
	// Database, nothing else.
	User = "locker"
	// DefaultPassword is User's password unless WithPassword sets another.
	DefaultPassword = "pgtest-password"

	// startTimeout bounds how long a server may take to accept connections
	// after start, crash recovery included, on a loaded 2-core machine.
	startTimeout = 60 * time.Second
	// startAttempts is how many ports a new server tries before the test fails.
	startAttempts = 3
	// probeTimeout bounds one readiness probe.
	probeTimeout = 2 * time.Second
	// runAs is the system user the servers run as when the tests run as root.
	runAs = "postgres"
)

// BinDir returns the directory holding initdb and postgres, or an error that
// says how to install them.
func BinDir() (string, error) {
	var tried []string
	ok := func(dir string) bool {
		tried = append(tried, dir)
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() { //nolint:gosec // G703: a directory the developer chose, only stat'ed
				return false
			}
		}
		return true
	}
	if d := os.Getenv("LOCKWARDEN_PG_BINDIR"); d != "" {
		if ok(d) {
			return d, nil
		}
		return "", fmt.Errorf("LOCKWARDEN_PG_BINDIR=%s holds no initdb and postgres: %s", d, InstallHint)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" && ok(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first ("9.6" < "10" < "15": compare numerically).
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL server binaries not found (looked in %s): %s", strings.Join(append(tried, "/usr/lib/postgresql/*/bin"), ", "), InstallHint)
}

// version is the major version in a /usr/lib/postgresql/<v>/bin path, as a
// number comparable across "9.6" and "15".
func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// Require skips t under -short, and when the binaries are missing skips it
// with the install command, or fails it when LOCKWARDEN_REQUIRE_SERVERS is set.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL servers; skipped with -short")
	}
	if _, err := BinDir(); err != nil {
		if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
			t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but PostgreSQL is missing: %v", err)
		}
		t.Skipf("PostgreSQL missing: %v", err)
	}
}

// Option configures a server started by Start.
type Option func(*config)

type config struct {
	password string
	tls      bool
	settings []string // "name=value", passed as -c options
	clock    bool     // WithClockControl
}

// WithPassword sets User's password. Default: DefaultPassword.
func WithPassword(p string) Option { return func(c *config) { c.password = p } }

// WithTLS makes the server accept TCP connections only over TLS, with a
// certificate for 127.0.0.1 and localhost signed by a fresh CA (see
// Server.CAPEM and Server.TLSConfig). Default: plain TCP.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithServerSetting starts the server with the configuration parameter name
// set to value (postgres -c name=value), on every start, Restart included,
// after the harness's own settings, so it may override them: for tests that
// need, say, a long wal_writer_delay. An unknown name makes Start fail with
// the server's log.
func WithServerSetting(name, value string) Option {
	return func(c *config) { c.settings = append(c.settings, name+"="+value) }
}

// WithClockControl starts the server with libfaketime preloaded, reading its
// wall-clock offset from a file that SetClockOffset rewrites while the server
// runs: a jump of the database server's clock (clock_timestamp(), now()).
// The monotonic clock stays real. Call faketime.Require first: Start fails
// without the library.
func WithClockControl() Option { return func(c *config) { c.clock = true } }

// clockFile is the file, in the server's root, that libfaketime reads the
// offset from (WithClockControl).
const clockFile = "faketime"

// SetClockOffset sets the server's wall clock d off the machine's (ahead for
// a positive d) from now on, for every process of the server. It needs
// WithClockControl.
func (s *Server) SetClockOffset(d time.Duration) error {
	if !s.cfg.clock {
		return errors.New("pgtest: SetClockOffset needs WithClockControl")
	}
	return s.writeClock(d)
}

// writeClock replaces the offset file in one rename, so that a server
// process never reads half of it.
func (s *Server) writeClock(d time.Duration) error {
	tmp := filepath.Join(s.root, clockFile+".tmp")
	if err := os.WriteFile(tmp, []byte(faketime.Offset(d)+"\n"), 0o644); err != nil { //nolint:gosec // G306: the postgres user reads it
		return err
	}
	return os.Rename(tmp, filepath.Join(s.root, clockFile))
}

// Server is one PostgreSQL postmaster owned by a test.
type Server struct {
	// Host is the TCP host clients use ("127.0.0.1").
	Host string
	// Port is the TCP port, stable across Restart.
	Port int
	// Addr is Host:Port.
	Addr string
	// Database, User and Password are what the code under test logs in with.
	Database, User, Password string
	// CAPEM is the PEM of the CA that signed the server certificate (WithTLS only).
	CAPEM []byte

	cfg     config
	bin     string
	root    string // our directory under os.TempDir(), removed in cleanup
	data    string // the data directory
	sock    string // the Unix socket directory
	logPath string
	cred    *syscall.Credential // nil when not running as root

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

// Start starts one server and returns once it accepts connections from User.
// It is killed when t ends; its log tail is printed when t failed.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	Require(t)
	cfg := config{password: DefaultPassword}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := launchNew(cfg)
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("PostgreSQL log (%s):\n%s", s.Addr, s.LogTail(40))
			}
			s.Close()
		})
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return s
}

func launchNew(cfg config) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, bin: bin, Host: "127.0.0.1", Database: Database, User: User, Password: cfg.password}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(runAs)
		if err != nil {
			return nil, fmt.Errorf("running as root, and PostgreSQL refuses to: look up the %q user to run it as: %w", runAs, err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir(): its parents are 0700 and owned by root, which the
	// postgres user cannot traverse. os.TempDir() is world-traversable.
	if err := s.makeRoot("pgtest-"); err != nil {
		return s, err
	}
	if err := s.initData(); err != nil {
		return s, err
	}
	if err := s.launchOnFreePort(); err != nil {
		return s, err
	}
	if err := s.setup(); err != nil {
		return s, err
	}
	return s, nil
}

// initData fills the data directory with a copy of the initdb template (see
// template) and writes this server's pg_hba.conf and TLS files.
func (s *Server) initData() error {
	tmpl, err := template(s.bin, s.cred)
	if err != nil {
		return err
	}
	// cp -a keeps the owner (postgres) and the 0700 mode PostgreSQL insists on.
	if out, err := exec.Command("cp", "-a", tmpl, s.data).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the initdb template: %w: %s", err, out)
	}
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		return err
	}
	hostType := "host"
	if s.cfg.tls {
		hostType = "hostssl"
	}
	// The superuser only through the private socket; everyone else only over
	// TCP with a password (and TLS with WithTLS).
	hba := strings.Join([]string{
		"local all postgres trust",
		// Streaming replication (StartStandby), as the superuser only.
		"local replication postgres trust",
		hostType + " all all 127.0.0.1/32 scram-sha-256",
		// A standby streaming over TCP (StartStandby with ReplicateVia).
		hostType + " replication " + ReplicationUser + " 127.0.0.1/32 scram-sha-256",
		hostType + " all all ::1/128 scram-sha-256",
	}, "\n") + "\n"
	files := map[string][]byte{filepath.Join(s.data, "pg_hba.conf"): []byte(hba)}
	if s.cfg.tls {
		ca, err := testpki.NewCA("pgtest CA", 24*time.Hour)
		if err != nil {
			return err
		}
		kp, err := ca.Issue(testpki.Leaf{CommonName: "127.0.0.1", Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			return err
		}
		s.CAPEM = ca.PEM
		files[filepath.Join(s.data, "server.crt")] = kp.CertPEM
		files[filepath.Join(s.data, "server.key")] = kp.KeyPEM
	}
	if err := testpki.WriteFiles(files); err != nil {
		return err
	}
	// The server refuses a key file readable by others or owned by someone else.
	for _, p := range append(keysOf(files), s.sock, s.root) {
		if err := s.chown(p); err != nil {
			return err
		}
	}
	return nil
}

func keysOf(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}

var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

// template returns the data directory of a cluster made by initdb, which
// every server copies. It is made once per machine, user and PostgreSQL
// installation, in a directory under os.TempDir() that later test processes
// reuse (initdb takes seconds on a loaded machine, and a template per process
// would leave tens of MB behind each time): made in a private directory and
// renamed into place, so concurrent test processes never see half of one.
func template(bin string, cred *syscall.Credential) (string, error) {
	templateOnce.Do(func() {
		sum := sha256.Sum256([]byte(bin))
		shared := filepath.Join(os.TempDir(), fmt.Sprintf("lockwarden-pgtest-template-%d-%x", os.Geteuid(), sum[:6]))
		if usableTemplate(shared) {
			templateDir = filepath.Join(shared, "data")
			return
		}
		tmp, err := makeTemplate(bin, cred)
		if err != nil {
			templateErr = err
			return
		}
		if err := os.Rename(tmp, shared); err != nil {
			if !usableTemplate(shared) {
				// Someone else's directory is in the way: use ours for this
				// process only (left behind, like any template).
				templateDir = filepath.Join(tmp, "data")
				return
			}
			_ = os.RemoveAll(tmp) // another process won the race
		}
		templateDir = filepath.Join(shared, "data")
	})
	return templateDir, templateErr
}

// usableTemplate reports whether dir is a finished template this user made:
// a real directory (not a symlink) owned by the effective user, holding a
// cluster.
func usableTemplate(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, "data", "PG_VERSION"))
	return err == nil
}

// makeTemplate runs initdb into a new directory under os.TempDir() and
// returns that directory (the cluster is in its data subdirectory).
func makeTemplate(bin string, cred *syscall.Credential) (string, error) {
	root, err := os.MkdirTemp("", "lockwarden-pgtest-template-tmp-")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		_ = os.RemoveAll(root)
		return "", err
	}
	// The postgres user must traverse it when the tests run as root.
	if err := os.Chmod(root, 0o755); err != nil { //nolint:gosec // G302: a directory, traversable on purpose
		return fail(err)
	}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "initdb"),
		"-D", filepath.Join(root, "data"), "-U", "postgres", "-E", "UTF8", "--no-locale",
		"--auth-local=trust", "--auth-host=scram-sha-256",
		// No fsync: the template is copied, never run.
		"--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, out))
	}
	// Owned by the effective user again, so usableTemplate accepts it.
	if cred != nil {
		if err := os.Chown(root, os.Geteuid(), os.Getegid()); err != nil {
			return fail(err)
		}
	}
	return root, nil
}

// launch starts the postmaster on s.Port and waits until it accepts
// connections through its private socket; on failure it is gone when launch
// returns.
func (s *Server) launch() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"-D", s.data,
		"-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=" + s.Host,
		"-c", "unix_socket_directories=" + s.sock,
		// The faults tests inject are process kills, not machine crashes:
		// written WAL sits in the page cache and survives a SIGKILL, so
		// crash recovery finds every committed transaction without an fsync
		// (which a loaded test machine cannot afford).
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
		"-c", "shared_buffers=16MB",
		"-c", "logging_collector=off",
		"-c", "log_line_prefix=%m [%p] ",
	}
	if s.cfg.tls {
		args = append(args, "-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key")
	}
	for _, kv := range s.cfg.settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	if s.cfg.clock {
		lib, err := faketime.Lib()
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(s.root, clockFile)); errors.Is(err, os.ErrNotExist) {
			if err := s.writeClock(0); err != nil {
				return err
			}
		}
		cmd.Env = append(os.Environ(),
			"LD_PRELOAD="+lib,
			"FAKETIME_TIMESTAMP_FILE="+filepath.Join(s.root, clockFile),
			// Read the file at every clock call, so that a new offset
			// applies at once (SetClockOffset).
			"FAKETIME_NO_CACHE=1",
			"FAKETIME_DONT_FAKE_MONOTONIC=1",
		)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = s.root
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: s.cred,
		// If the test binary dies without running cleanups (a timeout
		// kill), the kernel kills the postmaster; its backends notice and exit.
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a terminal's Ctrl-C (make dev) reaches the
		// program that started it, which stops it in order, not the server.
		Setpgid: true,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited, s.paused = cmd, exited, false
	s.mu.Unlock()
	if err := s.waitReady(exited); err != nil {
		s.Kill()
		return fmt.Errorf("postgres (pid %d) on %s: %w; log:\n%s", cmd.Process.Pid, s.Addr, err, s.LogTail(20))
	}
	return nil
}

// waitReady returns once the postmaster accepts superuser connections on its
// private socket. The postmaster exits when it cannot bind its TCP port, so
// a live, ready postmaster owns that port.
func (s *Server) waitReady(exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	var last error
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = s.superuserExec(ctx, "SELECT 1")
		return last == nil, nil
	})
	select {
	case <-exited:
		return errors.New("the process exited during start (could it bind its port?)")
	default:
	}
	if err != nil {
		return fmt.Errorf("not accepting connections within %v (last probe: %w)", startTimeout, last)
	}
	return nil
}

// superuserExec runs statements as the superuser over the private socket,
// in database db (default "postgres").
func (s *Server) superuserExec(ctx context.Context, sql string, dbs ...string) error {
	db := "postgres"
	if len(dbs) > 0 {
		db = dbs[0]
	}
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database, cfg.Password = s.sock, uint16(s.Port), "postgres", db, "" //nolint:gosec // G115: a port freeport handed out
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	cfg.ConnectTimeout = probeTimeout
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c, err := pgx.ConnectConfig(pctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(pctx, sql)
	return err
}

// setup creates the database and the role of the code under test, with
// only the grants the lock backend documents.
func (s *Server) setup() error {
	ctx := context.Background()
	stmts := []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", pgx.Identifier{User}.Sanitize(), quote(s.Password)),
		fmt.Sprintf("CREATE DATABASE %s", pgx.Identifier{Database}.Sanitize()),
		fmt.Sprintf("REVOKE ALL ON DATABASE %s FROM PUBLIC", pgx.Identifier{Database}.Sanitize()),
		fmt.Sprintf("GRANT CONNECT, CREATE ON DATABASE %s TO %s", pgx.Identifier{Database}.Sanitize(), pgx.Identifier{User}.Sanitize()),
	}
	for _, q := range stmts {
		// Probes may fail once under load; the server was ready a moment ago.
		if err := retry(ctx, func() error { return s.superuserExec(ctx, q) }); err != nil {
			return fmt.Errorf("setup %q: %w", strings.SplitN(q, " PASSWORD", 2)[0], err)
		}
	}
	return nil
}

func retry(ctx context.Context, f func() error) error {
	var err error
	for range 3 {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// quote returns s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TLSConfig returns a client TLS configuration that trusts this server's CA
// and expects its certificate for Host (nil without WithTLS).
func (s *Server) TLSConfig() *tls.Config {
	if !s.cfg.tls {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM)
	return &tls.Config{RootCAs: pool, ServerName: s.Host, MinVersion: tls.VersionTLS12}
}

// Conn opens a pgx connection as User (TLS with WithTLS), closed when t ends:
// a raw client for tests that look at the tables or measure the floor.
func (s *Server) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database = s.Host, uint16(s.Port), s.User, s.Password, s.Database //nolint:gosec // G115: a port freeport handed out
	cfg.TLSConfig, cfg.Fallbacks = s.TLSConfig(), nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", s.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// SuperuserExec runs sql as the superuser in Database (through the private
// socket): for tests that need to break things on purpose.
func (s *Server) SuperuserExec(ctx context.Context, sql string) error {
	return s.superuserExec(ctx, sql, Database)
}

// Running reports whether the postmaster is alive (paused counts as alive).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the postmaster and all its backends at once (a
// crash) and waits for them to be gone. The data stays: Restart runs crash
// recovery.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.paused = false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	pid := cmd.Process.Pid
	// Every backend, not just the postmaster: orphaned backends would keep
	// the shared memory attached and the restarted postmaster would refuse
	// to start. The postmaster is stopped first so that it forks no backend
	// while its children are listed (they are their own process groups, so
	// signalling the postmaster's group does not reach them).
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-exited
	waitGone(kids)
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name in parentheses may contain spaces: the fields
		// after the last ')' are state, ppid, ...
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// waitGone waits until the processes are gone (reaped by init once their
// parent, the postmaster, is gone).
func waitGone(pids []int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// Restart starts a killed server again on the same port with its data, and
// returns once it accepts connections (after crash recovery).
func (s *Server) Restart() error {
	if s.Running() {
		return fmt.Errorf("restart of %s while it is running: Kill it first", s.Addr)
	}
	if err := s.launch(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Pause sends SIGSTOP to the postmaster and its backends and returns once
// they have stopped: the server keeps its port and connections but answers
// nothing, like one behind a partition.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused server.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("signal %v to %s that never started", sig, s.Addr)
	}
	pid := s.cmd.Process.Pid
	// Stop the postmaster first so that it forks nobody unpaused; resume it
	// last, after its backends.
	if sig == syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("signal %v to %s: %w", sig, s.Addr, err)
		}
	}
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, sig)
	}
	if sig == syscall.SIGSTOP {
		for _, k := range append(kids, pid) {
			if err := proc.WaitStopped(k); err != nil {
				return fmt.Errorf("pause %s: %w", s.Addr, err)
			}
		}
	}
	if sig != syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("signal %v to %s: %w", sig, s.Addr, err)
		}
	}
	s.paused = paused
	return nil
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	return proc.Tail(s.logPath, n)
}

// Close kills the server, gives its port back and removes its directory.
func (s *Server) Close() {
	s.mu.Lock()
	cmd, paused := s.cmd, s.paused
	s.mu.Unlock()
	if cmd != nil && paused {
		_ = s.Resume()
	}
	s.Kill()
	if s.Port != 0 {
		freeport.Give(s.Port)
	}
	if s.root != "" {
		_ = os.RemoveAll(s.root)
	}
}

// launchOnFreePort starts the server on a free port, trying another when
// the one taken is lost to another process before the server binds it.
func (s *Server) launchOnFreePort() error {
	var errs []error
	for range startAttempts {
		port, err := freeport.Take()
		if err != nil {
			return err
		}
		s.Port = port
		s.Addr = net.JoinHostPort(s.Host, strconv.Itoa(port))
		if err = s.launch(); err == nil {
			return nil
		}
		errs = append(errs, err)
		freeport.Give(port)
		s.Port = 0
	}
	return fmt.Errorf("no port worked in %d attempts: %w", startAttempts, errors.Join(errs...))
}

// makeRoot creates the server's directory (named after prefix) and sets the
// paths of its data directory, socket directory and log inside it.
func (s *Server) makeRoot(prefix string) error {
	var err error
	if s.root, err = os.MkdirTemp("", prefix); err != nil {
		return err
	}
	if err := os.Chmod(s.root, 0o755); err != nil { //nolint:gosec // G302: a directory the postgres user must traverse
		return err
	}
	s.data = filepath.Join(s.root, "data")
	s.sock = filepath.Join(s.root, "sock")
	s.logPath = filepath.Join(s.root, "postgres.log")
	return nil
}
