// Package zktest starts real Apache ZooKeeper servers (the JVM server of the
// Debian/Ubuntu `zookeeper` package) for tests: one standalone server, or an
// ensemble of n servers that elect a leader among themselves.
//
// Every server listens on free loopback ports (package freeport), keeps its
// data and log in a temporary directory, and is killed when the test (or, for
// a shared ensemble, Close) ends. A server can be killed (SIGKILL), restarted
// with its data, paused (SIGSTOP) and resumed (SIGCONT), and asked for its
// role with the "srvr" four-letter command, so tests can kill the leader or
// cut off a follower.
//
// The servers run with a short tickTime (200ms): elections and session
// expiry take seconds, not minutes. Session timeouts up to MaxSessionTimeout
// are accepted, so a client session can outlive one leader election on a
// loaded machine.
//
// With -short every test that starts a server is skipped. When Java or the
// ZooKeeper jars are missing the test is skipped with the install command,
// or fails when LOCKWARDEN_REQUIRE_SERVERS is set (CI must not pass silently).
// LOCKWARDEN_JAVA and LOCKWARDEN_ZOOKEEPER_CLASSPATH override where the JVM
// and the jars are looked for.
package zktest

import (
	"bufio"
	"context"
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

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/proc"
)

const (
	// TickTime is the servers' tickTime: the unit of ZooKeeper's timeouts.
	TickTime = 200 * time.Millisecond
	// MaxSessionTimeout is the longest session timeout the servers grant.
	MaxSessionTimeout = 60 * time.Second
	// startTimeout bounds how long a JVM may take to serve after start; JVMs
	// start slowly on a loaded 2-core machine.
	startTimeout = 90 * time.Second
	// startAttempts is how many port sets a new server tries.
	startAttempts = 3
	// probeTimeout bounds one four-letter-word probe.
	probeTimeout = 2 * time.Second
	// InstallHint says how to get the servers.
	InstallHint = "run hack/ensure-zookeeper.sh (or: sudo apt-get install zookeeper), or set LOCKWARDEN_JAVA and LOCKWARDEN_ZOOKEEPER_CLASSPATH"
)

// logName is the server's log file in its directory (stdout and stderr of the JVM).
const logName = "server.log"

// Mode is a server's role as "srvr" reports it.
type Mode string

const (
	// ModeLeader is the ensemble's leader.
	ModeLeader Mode = "leader"
	// ModeFollower follows the leader.
	ModeFollower Mode = "follower"
	// ModeStandalone is a server without an ensemble.
	ModeStandalone Mode = "standalone"
)

// Runtime returns the java binary and the classpath the servers start with,
// or an error that says how to install them.
func Runtime() (java, classpath string, err error) {
	java = os.Getenv("LOCKWARDEN_JAVA")
	if java == "" {
		java, err = exec.LookPath("java")
		if err != nil {
			return "", "", fmt.Errorf("java not found on PATH: %s", InstallHint)
		}
	}
	if st, err := os.Stat(java); err != nil || st.IsDir() || st.Mode()&0o111 == 0 { //nolint:gosec // G703: a path the developer set, checked before use
		return "", "", fmt.Errorf("java %q is not an executable file: %s", java, InstallHint)
	}
	classpath = os.Getenv("LOCKWARDEN_ZOOKEEPER_CLASSPATH")
	if classpath != "" {
		for _, entry := range strings.Split(classpath, ":") {
			if _, err := os.Stat(entry); err != nil { //nolint:gosec // G703: a path the developer set, checked before use
				return "", "", fmt.Errorf("LOCKWARDEN_ZOOKEEPER_CLASSPATH entry %q: %w; %s", entry, err, InstallHint)
			}
		}
	} else {
		// zookeeper.jar's manifest names its dependencies; slf4j-simple
		// makes the server log (to stderr, which goes to the log file).
		jar := "/usr/share/java/zookeeper.jar"
		if _, err := os.Stat(jar); err != nil {
			return "", "", fmt.Errorf("%s not found: %s", jar, InstallHint)
		}
		classpath = jar
		if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
			classpath += ":/usr/share/java/slf4j-simple.jar"
		}
	}
	return java, classpath, nil
}

// Require skips t under -short, and when the servers are missing skips it
// with the install command, or fails it when LOCKWARDEN_REQUIRE_SERVERS is set.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts ZooKeeper servers; skipped with -short")
	}
	if _, _, err := Runtime(); err != nil {
		if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
			t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but the ZooKeeper servers are missing: %v", err)
		}
		t.Skipf("ZooKeeper servers missing: %v", err)
	}
}

// Server is one ZooKeeper server process.
type Server struct {
	// ID is the server's myid (1..n; 1 for a standalone server).
	ID int
	// Addr is the client address host:port, stable across Restart.
	Addr string

	dir      string
	conf     string
	ports    []int // client, quorum, election (quorum ports only in an ensemble)
	ensemble bool
	env      []string // added to the JVM's environment (a faked clock)

	proc proc.Process
}

// Ensemble is a set of servers started together (one for a standalone server).
type Ensemble struct {
	// Servers are the members, by ID order.
	Servers []*Server
}

// Start starts one standalone server and returns when it serves clients; it
// is killed when t ends, and its log tail is printed if t failed.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartEnsemble(t, 1).Servers[0]
}

// StartEnsemble starts n servers (n = 1: standalone) and returns when every
// one serves and one of them leads. They are killed when t ends.
func StartEnsemble(t testing.TB, n int, opts ...Option) *Ensemble {
	t.Helper()
	Require(t)
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.offsets) > 0 {
		RequireFaketime(t)
	}
	e, err := Launch(t.TempDir(), n, opts...)
	if e != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("ZooKeeper logs:\n%s", e.LogTails(40))
			}
			e.Close()
		})
	}
	if err != nil {
		t.Fatalf("zktest: %v", err)
	}
	return e
}

// Launch starts n servers under dir without a testing.TB, for an ensemble a
// whole test binary shares (started from TestMain or lazily once); the caller
// must Close it. n = 1 starts a standalone server. On error the returned
// ensemble (when not nil) holds whatever was started: Close it too.
func Launch(dir string, n int, opts ...Option) (*Ensemble, error) {
	if n < 1 {
		return nil, fmt.Errorf("launch %d servers: want at least 1", n)
	}
	if _, _, err := Runtime(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	env := map[int][]string{}
	for id, d := range o.offsets {
		if id < 1 || id > n {
			return nil, fmt.Errorf("clock offset for server %d: the ensemble has servers 1..%d", id, n)
		}
		e, err := clockEnv(d)
		if err != nil {
			return nil, err
		}
		env[id] = e
	}
	var errs []error
	for range startAttempts {
		e, err := launchOnce(dir, n, env)
		if err == nil {
			return e, nil
		}
		errs = append(errs, err)
		e.Close()
	}
	return nil, fmt.Errorf("no set of ports worked in %d attempts: %w", startAttempts, errors.Join(errs...))
}

func launchOnce(dir string, n int, env map[int][]string) (*Ensemble, error) {
	per := 1
	if n > 1 {
		per = 3
	}
	ports, err := freeport.TakeN(n * per)
	if err != nil {
		return nil, err
	}
	e := &Ensemble{}
	for i := range n {
		s := &Server{ID: i + 1, ports: ports[i*per : (i+1)*per], ensemble: n > 1, env: env[i+1]}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ports[0]))
		s.dir, err = os.MkdirTemp(dir, fmt.Sprintf("zk%d-", s.ID))
		if err != nil {
			return e, err
		}
		e.Servers = append(e.Servers, s)
	}
	for _, s := range e.Servers {
		if err := s.writeConfig(e.Servers); err != nil {
			return e, err
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range e.Servers {
		wg.Go(func() { errs[i] = s.launch() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return e, err
	}
	if n > 1 {
		if err := e.WaitLeader(startTimeout); err != nil {
			return e, fmt.Errorf("%w; logs:\n%s", err, e.LogTails(20))
		}
	}
	return e, nil
}

func (s *Server) writeConfig(all []*Server) error {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o750); err != nil {
		return err
	}
	lines := []string{
		fmt.Sprintf("tickTime=%d", TickTime.Milliseconds()),
		// Followers get 4s to sync with a new leader and 2s of silence
		// before they give up on it: short for fast elections, long
		// enough for a JVM on a loaded machine.
		"initLimit=20",
		"syncLimit=10",
		"dataDir=" + data,
		fmt.Sprintf("clientPort=%d", s.ports[0]),
		"clientPortAddress=127.0.0.1",
		"admin.enableServer=false",
		"4lw.commands.whitelist=srvr,ruok,mntr",
		fmt.Sprintf("maxSessionTimeout=%d", MaxSessionTimeout.Milliseconds()),
		// The data survives SIGKILL (it is in the page cache) without an
		// fsync per transaction, which a loaded test machine cannot afford.
		"forceSync=no",
		"preAllocSize=1024",
		"maxClientCnxns=0",
	}
	if s.ensemble {
		for _, o := range all {
			lines = append(lines, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", o.ID, o.ports[1], o.ports[2]))
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(s.ID)+"\n"), 0o600); err != nil {
			return err
		}
	}
	s.conf = filepath.Join(s.dir, "zoo.cfg")
	return os.WriteFile(s.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// launch starts the JVM and waits until it serves clients (it reports a
// mode); on failure the process is gone when launch returns.
func (s *Server) launch() error {
	java, cp, err := Runtime()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(java,
		"-Xmx128m", "-Xms16m", "-Xss512k",
		// Start fast: one GC thread, the client compiler only.
		"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
		"-Djava.awt.headless=true",
		"-Dzookeeper.admin.enableServer=false",
		"-Dzookeeper.jmx.log4j.disable=true",
		// Peers of a dead leader find out within a second.
		"-Dzookeeper.cnxTimeout=1000",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
		"-cp", cp,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	// If the test binary dies without running cleanups (a timeout kill), the
	// kernel takes the server down with it. Its own process group: a
	// terminal's Ctrl-C (make dev) reaches the program that started it, which
	// stops it in order, not the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	exited, err := s.proc.Start(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", java, err)
	}
	if err := s.waitServing(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("zookeeper server %d (pid %d) on %s: %w; log:\n%s", s.ID, cmd.Process.Pid, s.Addr, err, s.LogTail(20))
	}
	return nil
}

// waitServing returns once the server reports a mode on its client port. A
// member of an ensemble that has not joined a quorum yet answers "This
// ZooKeeper instance is not currently serving requests" and is waited for.
func (s *Server) waitServing(exited <-chan struct{}) error {
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
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := s.Mode()
		last = err
		return err == nil, nil
	})
	select {
	case <-exited:
		return errors.New("the process exited during start (could it bind its ports?)")
	default:
	}
	if err != nil {
		return fmt.Errorf("not serving within %v (last probe: %w)", startTimeout, last)
	}
	return nil
}

// FourLetter sends a four-letter command ("srvr", "ruok", "mntr") to the
// server's client port and returns the answer.
func (s *Server) FourLetter(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, probeTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var b strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return b.String(), err
	}
	return b.String(), nil
}

// Mode asks the server for its role (srvr). It fails while the server is
// down, paused or not part of a quorum.
func (s *Server) Mode() (Mode, error) {
	out, err := s.FourLetter("srvr")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Mode: "); ok {
			return Mode(strings.TrimSpace(v)), nil
		}
	}
	return "", fmt.Errorf("no mode in srvr answer %q", strings.TrimSpace(out))
}

// Running reports whether the process is alive (paused counts as alive).
func (s *Server) Running() bool { return s.proc.Running() }

// Paused reports whether it was paused and not resumed.
func (s *Server) Paused() bool { return s.proc.Paused() }

// Kill sends SIGKILL and waits for the process to be gone. The data stays.
func (s *Server) Kill() { s.proc.Kill() }

// Restart starts a killed server again on the same ports with its data, and
// returns once it serves (in an ensemble: once it has rejoined the quorum).
func (s *Server) Restart() error {
	if s.Running() {
		return fmt.Errorf("restart of server %d (%s) while it is running: Kill it first", s.ID, s.Addr)
	}
	if err := s.launch(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Pause sends SIGSTOP: the process keeps its ports and data but answers
// nothing, like a server behind a partition or in a long GC pause.
func (s *Server) Pause() error { return s.proc.Pause() }

// Resume sends SIGCONT to a paused process.
func (s *Server) Resume() error { return s.proc.Resume() }

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	return proc.Tail(filepath.Join(s.dir, logName), n)
}

func (s *Server) stop() {
	s.Kill()
}

// Addrs returns the members' client addresses.
func (e *Ensemble) Addrs() []string {
	out := make([]string, len(e.Servers))
	for i, s := range e.Servers {
		out[i] = s.Addr
	}
	return out
}

// ConnectString returns the addresses joined with commas, as ZooKeeper
// clients take them.
func (e *Ensemble) ConnectString() string { return strings.Join(e.Addrs(), ",") }

// Leader returns the member that reports itself leader (a standalone server
// counts as its own leader).
func (e *Ensemble) Leader() (*Server, error) {
	var errs []error
	for _, s := range e.Servers {
		if !s.Running() || s.Paused() {
			continue
		}
		m, err := s.Mode()
		if err != nil {
			errs = append(errs, fmt.Errorf("server %d: %w", s.ID, err))
			continue
		}
		if m == ModeLeader || m == ModeStandalone {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no leader: %w", errors.Join(errs...))
}

// Followers returns the running members that report themselves followers.
func (e *Ensemble) Followers() []*Server {
	var out []*Server
	for _, s := range e.Servers {
		if !s.Running() || s.Paused() {
			continue
		}
		if m, err := s.Mode(); err == nil && m == ModeFollower {
			out = append(out, s)
		}
	}
	return out
}

// WaitLeader waits until every running, unpaused member serves and one of
// them leads.
func (e *Ensemble) WaitLeader(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		leaders := 0
		for _, s := range e.Servers {
			if !s.Running() || s.Paused() {
				continue
			}
			m, err := s.Mode()
			if err != nil {
				last = fmt.Errorf("server %d: %w", s.ID, err)
				return false, nil
			}
			if m == ModeLeader || m == ModeStandalone {
				leaders++
			}
		}
		if leaders != 1 {
			last = fmt.Errorf("%d leaders", leaders)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("ensemble not serving with one leader within %v: %w", timeout, last)
	}
	return nil
}

// LogTails returns the last n log lines of every member.
func (e *Ensemble) LogTails(n int) string {
	var b strings.Builder
	for _, s := range e.Servers {
		fmt.Fprintf(&b, "--- server %d (%s) ---\n%s\n", s.ID, s.Addr, s.LogTail(n))
	}
	return b.String()
}

// Close kills every member and gives its ports back. A nil ensemble is fine.
func (e *Ensemble) Close() {
	if e == nil {
		return
	}
	for _, s := range e.Servers {
		s.stop()
		freeport.Give(s.ports...)
	}
}
