// Package redistest starts real redis-server processes for tests.
//
// Every server listens on a free loopback port, lives in a temporary directory
// owned by the test, and is killed when the test ends, whether it passed,
// failed or panicked. A server counts as started only when the process on its
// address reports the PID of the process just started (INFO's process_id):
// a port picked as free can be bound by someone else before the server binds
// it, and then the server is started again on another port. A server can be killed (SIGKILL), restarted on the same
// port, paused (SIGSTOP) and resumed (SIGCONT), so tests can inject the faults
// a distributed lock has to survive.
//
// With -short, every test that starts a server is skipped.
//
// The redis-server binary is found on PATH, or at $LOCKWARDEN_REDIS_SERVER.
// `make test` installs it when it is missing; a test never uses a Redis it did
// not start.
package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/proc"
)

const (
	// startTimeout bounds how long a server may take to answer PING after start.
	startTimeout = 15 * time.Second
	// startAttempts is how many ports a new server tries before the test fails.
	startAttempts = 5
	// probeTimeout bounds one readiness probe, so that a port held by a
	// program that accepts connections but never answers is noticed quickly.
	probeTimeout = time.Second
)

// pickPort chooses the port of a new server. Tests replace it to hand out a
// port that is already taken.
var pickPort = freeport.Take

// Option configures a server started by Start or StartN.
type Option func(*config)

type config struct {
	password    string
	persistence bool
	tls         bool
	replicaOf   *Server
	// sentinel, when set, makes the process a Sentinel monitoring that master.
	sentinel *sentinelConfig
}

type sentinelConfig struct {
	master     *Server
	masterName string
	quorum     int
}

// WithPassword makes the server require a password (requirepass). Default: none.
func WithPassword(password string) Option { return func(c *config) { c.password = password } }

// WithPersistence turns on the append-only file with fsync on every write, so
// the data survives Kill and Restart. Default: off, so a restarted server is empty.
func WithPersistence() Option { return func(c *config) { c.persistence = true } }

// WithTLS makes the server accept only TLS connections, with a certificate for
// 127.0.0.1 and localhost signed by a fresh CA (see Server.CAPEM). Default: plain TCP.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithReplicaOf makes the server a replica of master (REPLICAOF), for
// Sentinel failover tests: Start returns once it is in sync with master.
// Its role is then Redis's own: a Sentinel that promotes it, or turns it into
// a replica of another server, rewrites its configuration file (CONFIG
// REWRITE), and Restart starts it in the role it last had. The replica has
// master's password (use WithPassword with the same one); TLS replicas are
// not supported. Default: a master. Never use replicas as Redlock members.
func WithReplicaOf(master *Server) Option { return func(c *config) { c.replicaOf = master } }

// Server is one redis-server process owned by a test.
type Server struct {
	// Addr is host:port of the server, stable across Restart.
	Addr string
	// Password is the requirepass value, empty when none.
	Password string
	// CAPEM is the PEM of the CA that signed the server certificate (TLS only).
	CAPEM []byte

	t       testing.TB
	cfg     config
	dir     string
	conf    string
	port    int
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	paused  bool
	clients []*redis.Client
	// admin is the client the harness itself uses (Role, the Sentinel
	// group's checks), created on first use.
	admin *redis.Client
	// replicas are the servers started WithReplicaOf(this one).
	replicas []*Server
}

// Binary returns the redis-server path the helpers use, or an error that says how to install it.
func Binary() (string, error) {
	if p := os.Getenv("LOCKWARDEN_REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found on PATH: run `make test` (it installs the redis-server package on Debian/Ubuntu) or install Redis 6.2+ and set LOCKWARDEN_REDIS_SERVER")
	}
	return p, nil
}

// Start starts one redis-server and returns when it answers PING. With
// -short it skips the test instead.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	return StartN(t, 1, opts...)[0]
}

// StartN starts n independent redis-server processes (independent masters, as
// Redlock needs) in parallel and returns when all answer PING, each from its
// own process on its own port. With -short it skips the test instead.
func StartN(t testing.TB, n int, opts ...Option) []*Server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts redis-server; skipped with -short")
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.replicaOf != nil && (cfg.tls || cfg.replicaOf.cfg.tls) {
		t.Fatal("redistest: TLS replicas are not supported")
	}
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range servers {
		s := &Server{t: t, cfg: cfg, Password: cfg.password, dir: t.TempDir()}
		servers[i] = s
		t.Cleanup(s.cleanup)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.startFresh()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	if m := cfg.replicaOf; m != nil {
		for i, s := range servers {
			errs[i] = s.replicate(m)
		}
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		m.mu.Lock()
		m.replicas = append(m.replicas, servers...)
		m.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
		defer cancel()
		if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			return m.AckedBy(ctx, len(servers)) == nil, nil
		}); err != nil {
			t.Fatalf("starting redis-server: the replicas of %s do not acknowledge writes: %v (last: %v)", m.Addr, err, m.AckedBy(context.Background(), len(servers)))
		}
	}
	return servers
}

// AckedBy writes to the master (a PUBLISH, which is replicated and touches
// no key) and returns nil once n replicas acknowledged it (WAIT n, within
// 100ms), as the lock engine needs of every acquisition in Sentinel mode. A
// replica can report its link up a moment before its master streams writes
// to it (after a full synchronisation the master waits for the replica's
// first acknowledgement, which can take up to a second).
func (s *Server) AckedBy(ctx context.Context, n int) error {
	conn := s.adminClient().Conn()
	defer conn.Close()
	if err := conn.Publish(ctx, "redistest:acked", "ping").Err(); err != nil {
		return err
	}
	got, err := conn.Wait(ctx, n, 100*time.Millisecond).Result()
	if err != nil {
		return err
	}
	if int(got) < n {
		return fmt.Errorf("%d of %d replicas of %s acknowledged a write within 100ms", got, n, s.Addr)
	}
	return nil
}

// syncTimeout bounds how long a new replica may take to be in sync.
const syncTimeout = 30 * time.Second

// replicate makes the server a replica of master, records it in its
// configuration file (so that Restart keeps the role) and waits until it is
// in sync. REPLICAOF connects at once; a replicaof line read at start would
// wait for the replication cron, up to a second.
func (s *Server) replicate(master *Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	host, port, _ := net.SplitHostPort(master.Addr)
	c := s.adminClient()
	if err := c.ReplicaOf(ctx, host, port).Err(); err != nil {
		return fmt.Errorf("REPLICAOF %s on %s: %w", master.Addr, s.Addr, err)
	}
	if err := c.ConfigRewrite(ctx).Err(); err != nil {
		return fmt.Errorf("CONFIG REWRITE on %s: %w", s.Addr, err)
	}
	return s.waitInSync(ctx, master.Addr)
}

// waitInSync waits until the server is a replica of masterAddr with its
// link up (INFO replication: master_link_status:up).
func (s *Server) waitInSync(ctx context.Context, masterAddr string) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		r, err := s.Role(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		if r.Role != "slave" || r.Master != masterAddr || !r.LinkUp {
			last = fmt.Errorf("role %+v", r)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s not in sync with %s: %w (last: %w)", s.Addr, masterAddr, err, last)
	}
	return nil
}

// Role is a server's replication role, from INFO replication.
type Role struct {
	// Role is "master" or "slave".
	Role string
	// Master is the master's host:port (replicas only).
	Master string
	// LinkUp tells whether a replica's link to its master is up and the
	// initial synchronisation done (master_link_status:up).
	LinkUp bool
	// Replicas is how many replicas are connected and in sync (state=online; masters only).
	Replicas int
}

// Role reads the server's replication role (INFO replication).
func (s *Server) Role(ctx context.Context) (Role, error) {
	info, err := s.adminClient().Info(ctx, "replication").Result()
	if err != nil {
		return Role{}, err
	}
	var r Role
	var host, port string
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "role":
			r.Role = v
		case k == "master_host":
			host = v
		case k == "master_port":
			port = v
		case k == "master_link_status":
			r.LinkUp = v == "up"
		case strings.HasPrefix(k, "slave") && strings.Contains(v, "state=online"):
			r.Replicas++
		}
	}
	if r.Role == "" {
		return r, errors.New("INFO replication has no role")
	}
	if host != "" {
		r.Master = net.JoinHostPort(host, port)
	}
	return r, nil
}

// Replicas returns the servers started WithReplicaOf(s), whatever their
// role now.
func (s *Server) Replicas() []*Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Server(nil), s.replicas...)
}

// adminClient is the harness's own client for the server, closed when the test ends.
func (s *Server) adminClient() *redis.Client {
	s.mu.Lock()
	c := s.admin
	s.mu.Unlock()
	if c != nil {
		return c
	}
	c = s.Client()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin == nil {
		s.admin = c
	}
	return s.admin
}

// startFresh picks a free port, writes the config and starts the process,
// retrying with another port when the process could not be confirmed on the
// chosen one (most often because another process bound it in between).
func (s *Server) startFresh() error {
	var errs []error
	for range startAttempts {
		port, err := pickPort()
		if err != nil {
			return err
		}
		s.port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := s.writeConfig(port); err != nil {
			return err
		}
		err = s.launch()
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("no port worked in %d attempts: %w", startAttempts, errors.Join(errs...))
}

func (s *Server) writeConfig(port int) error {
	lines := []string{
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + s.dir,
		"logfile " + filepath.Join(s.dir, "redis.log"),
		`save ""`,
	}
	if s.cfg.persistence {
		lines = append(lines, "appendonly yes", "appendfsync always")
	} else {
		lines = append(lines, "appendonly no")
	}
	if s.cfg.password != "" {
		lines = append(lines, "requirepass "+s.cfg.password, "masterauth "+s.cfg.password)
	}
	// A replica's full resynchronisation starts at once (the default waits
	// five seconds for more replicas to join a diskless transfer): after a
	// failover the old master, turned replica, is in sync within
	// milliseconds. A replica gets its replicaof from launchReplica, not
	// from this file: Redis rewrites the file (CONFIG REWRITE) whenever
	// REPLICAOF or a Sentinel changes its role, and Restart starts the
	// server from the rewritten file, in the role it last had.
	lines = append(lines, "repl-diskless-sync-delay 0")
	if sc := s.cfg.sentinel; sc != nil {
		lines = append([]string{
			"bind 127.0.0.1",
			"protected-mode no",
			"daemonize no",
			"dir " + s.dir,
			"logfile " + filepath.Join(s.dir, "redis.log"),
			fmt.Sprintf("port %d", port),
		}, sentinelLines(sc)...)
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		return os.WriteFile(s.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	}
	if s.cfg.tls {
		ca, certFile, keyFile, err := writeServerCerts(s.dir)
		if err != nil {
			return err
		}
		s.CAPEM = ca
		lines = append(lines,
			"port 0",
			fmt.Sprintf("tls-port %d", port),
			"tls-cert-file "+certFile,
			"tls-key-file "+keyFile,
			"tls-ca-cert-file "+filepath.Join(s.dir, "ca.crt"),
			"tls-auth-clients no",
		)
	} else {
		lines = append(lines, fmt.Sprintf("port %d", port))
	}
	s.conf = filepath.Join(s.dir, "redis.conf")
	return os.WriteFile(s.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// launch starts the process on the configured port and waits until it is
// confirmed there; on failure the process is gone when launch returns.
func (s *Server) launch() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	args := []string{s.conf}
	if s.cfg.sentinel != nil {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(bin, args...)
	// If the test binary dies without running cleanups (a timeout kill), the
	// kernel takes the server down with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited, s.paused = cmd, exited, false
	s.mu.Unlock()
	if err := s.waitReady(cmd.Process.Pid, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("redis-server (pid %d) on %s: %w; log:\n%s", cmd.Process.Pid, s.Addr, err, s.logTail())
	}
	return nil
}

// waitReady returns nil once the server on s.Addr is process pid and answers
// PING. It fails early when the process exits (it could not bind the port,
// most likely) or when another process answers on the port.
func (s *Server) waitReady(pid int, exited <-chan struct{}) error {
	o := s.clientOptions()
	o.ReadTimeout, o.WriteTimeout = probeTimeout, probeTimeout
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	var lastErr error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		owner, err := ProcessID(ctx, c)
		if err != nil {
			lastErr = err
			return false, nil // not listening yet
		}
		if owner != pid {
			return false, fmt.Errorf("the port is taken: process %d answers on it, not the redis-server just started (pid %d)", owner, pid)
		}
		if err := c.Ping(ctx).Err(); err != nil { // still loading its data
			lastErr = err
			return false, nil
		}
		return true, nil
	})
	select {
	case <-exited:
		return errors.New("the process exited during start (could it bind the port?)")
	default:
	}
	if err != nil && lastErr != nil {
		return fmt.Errorf("%w (last probe: %w)", err, lastErr)
	}
	return err
}

// ProcessID returns the process_id the server behind c reports in INFO
// server: which process really answers on an address.
func ProcessID(ctx context.Context, c *redis.Client) (int, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Options returns go-redis options that reach this server (password and TLS included).
func (s *Server) clientOptions() *redis.Options {
	password := s.cfg.password
	if s.cfg.sentinel != nil {
		password = ""
	}
	o := &redis.Options{Addr: s.Addr, Password: password, MaxRetries: -1, DialTimeout: time.Second}
	if s.cfg.tls {
		o.TLSConfig = s.TLSConfig()
	}
	return o
}

// TLSConfig returns a client TLS configuration that trusts this server's CA (nil without TLS).
func (s *Server) TLSConfig() *tls.Config {
	if !s.cfg.tls {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// Client returns a new go-redis client for this server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(s.clientOptions())
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

// Running reports whether the process is alive (paused counts as alive).
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

// Kill sends SIGKILL and waits for the process to be gone. Without
// persistence, everything the server held is lost.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Restart starts the server again on the same address. Without persistence it
// comes back empty, like a node that lost its data. It comes back in the
// role its configuration file names: Redis rewrites the file when REPLICAOF
// or a Sentinel changes its role, and Restart never writes it, so a master
// that a Sentinel turned into a replica restarts as that replica, and a
// killed master restarts as a master until a Sentinel turns it into one. The
// test fails when another process took the port while the server was down.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.restart(); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

func (s *Server) restart() error {
	if s.Running() {
		return fmt.Errorf("restart of %s while it is running: Kill it first", s.Addr)
	}
	// Kill waited for the process to exit, and a process's listening socket
	// is closed before it exits: the port is free again unless another
	// process bound it meanwhile, which launch detects.
	if err := s.launch(); err != nil {
		return fmt.Errorf("restart %s: %w", s.Addr, err)
	}
	return nil
}

// BlockReplication cuts a replica off its master until the returned
// unblock is called, as a network fault between them would, while both stay
// reachable by clients and Sentinels: the writes the master acknowledges
// meanwhile reach no replica. The replica's link to the master is killed
// (CLIENT KILL TYPE master) and, so that it cannot reconnect, it is given
// credentials the master refuses (masteruser, masterauth). Unblock restores
// its credentials; the replica then reconnects within a second (its
// replication cron) and catches up, unless its master is gone by then.
func (s *Server) BlockReplication(ctx context.Context) (unblock func(context.Context) error, err error) {
	c := s.adminClient()
	if err := c.ConfigSet(ctx, "masteruser", "redistest-blocked").Err(); err != nil {
		return nil, fmt.Errorf("block replication of %s: %w", s.Addr, err)
	}
	if err := c.ConfigSet(ctx, "masterauth", "redistest-blocked").Err(); err != nil {
		return nil, fmt.Errorf("block replication of %s: %w", s.Addr, err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		return nil, fmt.Errorf("block replication of %s: %w", s.Addr, err)
	}
	return func(ctx context.Context) error {
		if err := c.ConfigSet(ctx, "masteruser", "").Err(); err != nil {
			return fmt.Errorf("unblock replication of %s: %w", s.Addr, err)
		}
		if err := c.ConfigSet(ctx, "masterauth", s.cfg.password).Err(); err != nil {
			return fmt.Errorf("unblock replication of %s: %w", s.Addr, err)
		}
		// A Sentinel may have rewritten the file meanwhile.
		if err := c.ConfigRewrite(ctx).Err(); err != nil {
			return fmt.Errorf("unblock replication of %s: %w", s.Addr, err)
		}
		return nil
	}, nil
}

// pid returns the process id of the server's current (or last) process.
func (s *Server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Pause sends SIGSTOP and returns once the process has stopped: it holds its
// port and data but answers nothing, like a node in a long GC pause or behind
// a partition.
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP, true)
	if err := proc.WaitStopped(s.pid()); err != nil {
		s.t.Fatalf("redistest: pause %s: %v", s.Addr, err)
	}
}

// Resume sends SIGCONT to a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: signal %v to %s that never started", sig, s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v to %s: %v", sig, s.Addr, err)
	}
	s.paused = paused
}

func (s *Server) cleanup() {
	s.mu.Lock()
	clients := s.clients
	s.clients = nil
	cmd, exited, paused := s.cmd, s.exited, s.paused
	s.mu.Unlock()
	for _, c := range clients {
		_ = c.Close()
	}
	if cmd != nil {
		if paused {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	if s.port != 0 {
		freeport.Give(s.port)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no other server of this test process is given (see package freeport).
// Whoever starts a server on it must still confirm that the server is the
// process listening there.
func FreePort() (int, error) { return freeport.Take() }
