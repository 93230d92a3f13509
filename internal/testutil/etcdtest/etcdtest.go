// Package etcdtest starts real etcd servers for tests: one member, or a
// cluster of n members that elect a raft leader among themselves.
//
// Every member listens on free loopback ports (package freeport) for clients
// and peers, keeps its data in a temporary directory, writes its log to a file
// there (printed, tail only, when the test fails) and is killed when the test
// ends. A member can be killed (SIGKILL), restarted with its data (it rejoins
// the cluster), paused (SIGSTOP) and resumed (SIGCONT), and the cluster can be
// asked which member leads (maintenance Status API), so tests can kill the
// leader or cut off a follower.
//
// WithNetns (root only, see RequireNetns) starts each member in its own
// network namespace with its own address on a bridge instead, so that
// Cluster.IsolatePeers can cut one member off from its peers while the
// test's clients still reach it (netns.go).
//
// The members run with short raft timeouts (HeartbeatInterval,
// ElectionTimeout): a new leader is elected within a second or two on a loaded
// machine, and etcd's minimum lease TTL (1.5 election timeouts) is small.
//
// The etcd binary is looked for in $LOCKWARDEN_ETCD, $KUBEBUILDER_ASSETS/etcd,
// the newest ${XDG_CACHE_HOME:-$HOME/.cache}/lockwarden/control-plane/*/etcd
// (what hack/control-plane.sh builds), then PATH. With -short every test that
// starts a server is skipped. When the binary is missing the test is skipped
// with the install command, or fails when LOCKWARDEN_REQUIRE_SERVERS is set
// (CI must not pass silently).
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/proc"
)

const (
	// HeartbeatInterval is the members' raft heartbeat interval.
	HeartbeatInterval = 50 * time.Millisecond
	// ElectionTimeout is the members' raft election timeout. etcd's minimum
	// lease TTL is 1.5 times it (750ms, so 1s once rounded to seconds).
	ElectionTimeout = 500 * time.Millisecond
	// InstallHint says how to get the etcd binary.
	InstallHint = "run hack/control-plane.sh etcd (it builds etcd into ~/.cache/lockwarden/control-plane), or set LOCKWARDEN_ETCD to an etcd binary"
	// startTimeout bounds how long a member may take to serve after start
	// on a loaded 2-core machine.
	startTimeout = 60 * time.Second
	// startAttempts is how many port sets a new cluster tries (another
	// process may bind a port between freeport and etcd).
	startAttempts = 3
	// probeTimeout bounds one Status probe.
	probeTimeout = 2 * time.Second
	// RootUser is the user WithRootPassword creates.
	RootUser = "root"
)

// Binary returns the etcd binary to start, or an error that says how to
// install it.
func Binary() (string, error) {
	if p := os.Getenv("LOCKWARDEN_ETCD"); p != "" {
		if _, err := os.Stat(p); err != nil { //nolint:gosec // G703: a binary path the developer chose, only stat'ed
			return "", fmt.Errorf("LOCKWARDEN_ETCD=%s: %w", p, err)
		}
		return p, nil
	}
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		p := filepath.Join(d, "etcd")
		if _, err := os.Stat(p); err == nil { //nolint:gosec // G703: a binary path the developer chose, only stat'ed
			return p, nil
		}
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache")
		}
	}
	if cache != "" {
		matches, _ := filepath.Glob(filepath.Join(cache, "lockwarden", "control-plane", "*", "etcd"))
		// The newest build wins: the cache keeps older versions side by side.
		var best string
		var bestTime time.Time
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() && fi.ModTime().After(bestTime) { //nolint:gosec // G703: the developer's own cache, only stat'ed
				best, bestTime = m, fi.ModTime()
			}
		}
		if best != "" {
			return best, nil
		}
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("etcd binary not found: %s", InstallHint)
}

// Require skips t under -short, and when etcd is missing skips it with the
// install command, or fails it when LOCKWARDEN_REQUIRE_SERVERS is set.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd servers; skipped with -short")
	}
	if _, err := Binary(); err != nil {
		if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
			t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but etcd is missing: %v", err)
		}
		t.Skipf("etcd missing: %v", err)
	}
}

type options struct {
	rootPassword string
	tls          bool
	netns        bool
}

// Option configures Start and StartCluster.
type Option func(*options)

// WithRootPassword enables etcd authentication once the cluster serves: the
// user RootUser with this password and the root role. Clients then need
// Username RootUser and the password.
func WithRootPassword(pw string) Option { return func(o *options) { o.rootPassword = pw } }

// WithTLS makes the members serve clients with TLS only (a certificate for
// 127.0.0.1 from a throw-away CA); Cluster.ClientTLS trusts it. Peers talk
// plain HTTP among themselves.
func WithTLS() Option { return func(o *options) { o.tls = true } }

// Member is one etcd server process.
type Member struct {
	// Name is the member's name (m1..mn).
	Name string
	// Addr is the client address host:port, stable across Restart.
	Addr string

	dir     string
	logPath string
	ports   []int // client, peer (from freeport; nil WithNetns)
	cluster *Cluster
	host    string // the address the member listens on
	netns   string // its network namespace WithNetns, "" otherwise

	proc proc.Process
}

// Cluster is a set of members started together (one for Start).
type Cluster struct {
	// Members are the members, by name order.
	Members []*Member
	// Username and Password are the root credentials when the cluster was
	// started WithRootPassword; empty otherwise.
	Username, Password string
	// CAPEM is the CA that signed the members' certificate when the cluster
	// was started WithTLS; nil otherwise.
	CAPEM []byte

	token             string
	certFile, keyFile string
	netns             *netns // WithNetns
}

// Start starts one member and returns when it serves clients; it is killed
// when t ends, and its log tail is printed if t failed.
func Start(t testing.TB, opts ...Option) *Member {
	t.Helper()
	return StartCluster(t, 1, opts...).Members[0]
}

// StartCluster starts n members and returns when every one serves and one of
// them leads. They are killed when t ends.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	Require(t)
	c, err := Launch(t.TempDir(), n, opts...)
	if c != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("etcd logs:\n%s", c.LogTails(40))
			}
			c.Close()
		})
	}
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

// Launch starts n members under dir without a testing.TB (for a cluster a
// whole test binary shares); the caller must Close it. On error the returned
// cluster (when not nil) holds whatever was started: Close it too.
func Launch(dir string, n int, opts ...Option) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("launch %d etcd members: want at least 1", n)
	}
	if _, err := Binary(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.netns && o.tls {
		return nil, errors.New("WithNetns and WithTLS together are not supported (the certificate names 127.0.0.1 only)")
	}
	var errs []error
	for attempt := range startAttempts {
		c, err := launchOnce(dir, n, attempt, o)
		if err == nil {
			if o.rootPassword != "" {
				if err := c.enableAuth(o.rootPassword); err != nil {
					return c, err
				}
			}
			return c, nil
		}
		errs = append(errs, err)
		c.Close()
	}
	return nil, fmt.Errorf("no set of ports worked in %d attempts: %w", startAttempts, errors.Join(errs...))
}

func launchOnce(dir string, n, attempt int, o options) (*Cluster, error) {
	var (
		ports []int
		err   error
	)
	c := &Cluster{token: fmt.Sprintf("etcdtest-%d-%d", os.Getpid(), time.Now().UnixNano())}
	if o.netns {
		if c.netns, err = setupNetns(n); err != nil {
			return nil, fmt.Errorf("set up network namespaces: %w", err)
		}
	} else if ports, err = freeport.TakeN(2 * n); err != nil {
		return nil, err
	}
	if o.tls {
		certDir, err := os.MkdirTemp(dir, "certs-")
		if err != nil {
			return c, err
		}
		if c.CAPEM, c.certFile, c.keyFile, err = serverCerts(certDir); err != nil {
			return c, fmt.Errorf("make certificates: %w", err)
		}
	}
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i+1), cluster: c, host: "127.0.0.1"}
		clientPort := netnsClientPort
		if c.netns != nil {
			m.host, m.netns = c.netns.addr(i), c.netns.namespace(i)
		} else {
			m.ports = ports[2*i : 2*i+2]
			clientPort = m.ports[0]
		}
		m.Addr = net.JoinHostPort(m.host, strconv.Itoa(clientPort))
		m.dir, err = os.MkdirTemp(dir, fmt.Sprintf("etcd-%s-%d-", m.Name, attempt))
		if err != nil {
			return c, err
		}
		m.logPath = filepath.Join(m.dir, "etcd.log")
		c.Members = append(c.Members, m)
	}
	// The members of a new cluster wait for each other: start them all, then
	// wait for each.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.launch() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if _, err := c.WaitLeader(startTimeout); err != nil {
		return c, fmt.Errorf("%w; logs:\n%s", err, c.LogTails(20))
	}
	return c, nil
}

func (m *Member) peerURL() string {
	port := netnsPeerPort
	if m.netns == "" {
		port = m.ports[1]
	}
	return "http://" + net.JoinHostPort(m.host, strconv.Itoa(port))
}

func (m *Member) clientURL() string {
	if m.cluster.CAPEM != nil {
		return "https://" + m.Addr
	}
	return "http://" + m.Addr
}

func (m *Member) args() []string {
	var initial []string
	for _, o := range m.cluster.Members {
		initial = append(initial, o.Name+"="+o.peerURL())
	}
	var tlsArgs []string
	if m.cluster.certFile != "" {
		tlsArgs = []string{"--cert-file", m.cluster.certFile, "--key-file", m.cluster.keyFile}
	}
	return append(tlsArgs,
		"--name", m.Name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.clientURL(),
		"--advertise-client-urls", m.clientURL(),
		"--listen-peer-urls", m.peerURL(),
		"--initial-advertise-peer-urls", m.peerURL(),
		// Ignored on Restart: a member with data knows its cluster.
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", "new",
		"--initial-cluster-token", m.cluster.token,
		"--heartbeat-interval", strconv.FormatInt(HeartbeatInterval.Milliseconds(), 10),
		"--election-timeout", strconv.FormatInt(ElectionTimeout.Milliseconds(), 10),
		"--log-level", "warn",
		"--logger", "zap",
		"--log-outputs", "stderr",
		// The data survives SIGKILL without an fsync per write (it is in
		// the page cache), which a loaded test machine cannot afford; only
		// a machine crash would lose it, and tests do not crash machines.
		"--unsafe-no-fsync",
	)
}

// launch starts the process and waits until it answers Status; on failure
// the process is gone when launch returns.
func (m *Member) launch() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, m.args()...)
	if m.netns != "" {
		// ip execs etcd in the namespace: the process tracked is etcd's.
		ipPath, err := exec.LookPath("ip")
		if err != nil {
			return err
		}
		cmd = exec.Command(ipPath, append([]string{"netns", "exec", m.netns, bin}, m.args()...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without running cleanups (a timeout kill), the
	// kernel takes the server down with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := m.proc.Start(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	if err := m.waitServing(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("etcd member %s (pid %d) on %s: %w; log:\n%s", m.Name, cmd.Process.Pid, m.Addr, err, m.LogTail(20))
	}
	return nil
}

// waitServing returns once the member answers Status on its client port. A
// member that has not joined a quorum yet answers too (Status needs no
// quorum); WaitLeader waits for one.
func (m *Member) waitServing(exited <-chan struct{}) error {
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
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := m.Status()
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

// client returns a client of this member only, for probes.
func (m *Member) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{m.Addr},
		DialTimeout: probeTimeout,
		Logger:      zap.NewNop(),
		Username:    m.cluster.Username,
		Password:    m.cluster.Password,
		TLS:         m.cluster.ClientTLS(),
	})
}

// Status asks the member for its maintenance status (no quorum needed). It
// fails while the member is down or paused.
func (m *Member) Status() (*clientv3.StatusResponse, error) {
	cli, err := m.client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return cli.Status(ctx, m.Addr)
}

// IsLeader reports whether the member says it is the raft leader.
func (m *Member) IsLeader() (bool, error) {
	st, err := m.Status()
	if err != nil {
		return false, err
	}
	return st.Leader != 0 && st.Leader == st.Header.MemberId, nil
}

// Running reports whether the process is alive (paused counts as alive).
func (m *Member) Running() bool { return m.proc.Running() }

// Paused reports whether it was paused and not resumed.
func (m *Member) Paused() bool { return m.proc.Paused() }

// Kill sends SIGKILL and waits for the process to be gone. The data stays.
func (m *Member) Kill() { m.proc.Kill() }

// Restart starts a killed member again on the same ports with its data, and
// returns once it answers Status (it rejoins the cluster by itself).
func (m *Member) Restart() error {
	if m.Running() {
		return fmt.Errorf("restart of etcd member %s (%s) while it is running: Kill it first", m.Name, m.Addr)
	}
	if err := m.launch(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Pause sends SIGSTOP: the process keeps its ports and data but answers
// nothing, like a server behind a partition or in a long GC pause.
func (m *Member) Pause() error { return m.proc.Pause() }

// Resume sends SIGCONT to a paused process.
func (m *Member) Resume() error { return m.proc.Resume() }

// LogTail returns the last n lines of the member's log.
func (m *Member) LogTail(n int) string {
	return proc.Tail(m.logPath, n)
}

// Endpoints returns the members' client addresses (host:port).
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.Addr
	}
	return out
}

// Leader returns the running member that says it is the raft leader.
func (c *Cluster) Leader() (*Member, error) {
	var errs []error
	for _, m := range c.Members {
		if !m.Running() || m.Paused() {
			continue
		}
		ok, err := m.IsLeader()
		if err != nil {
			errs = append(errs, fmt.Errorf("member %s: %w", m.Name, err))
			continue
		}
		if ok {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no leader: %w", errors.Join(errs...))
}

// Followers returns the running, unpaused members that are not the leader.
func (c *Cluster) Followers() []*Member {
	var out []*Member
	for _, m := range c.Members {
		if !m.Running() || m.Paused() {
			continue
		}
		if ok, err := m.IsLeader(); err == nil && !ok {
			out = append(out, m)
		}
	}
	return out
}

// WaitLeader waits until every running, unpaused member answers and they
// agree on one leader, and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) (*Member, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		last   error
		leader *Member
	)
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		leaders := map[uint64]bool{}
		ids := map[uint64]*Member{}
		for _, m := range c.Members {
			if !m.Running() || m.Paused() {
				continue
			}
			st, err := m.Status()
			if err != nil {
				last = fmt.Errorf("member %s: %w", m.Name, err)
				return false, nil
			}
			leaders[st.Leader] = true
			ids[st.Header.MemberId] = m
		}
		if len(leaders) != 1 || leaders[0] {
			last = fmt.Errorf("members report leaders %v", keys(leaders))
			return false, nil
		}
		for id := range leaders {
			leader = ids[id]
		}
		if leader == nil {
			last = errors.New("the leader the members name is not running")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("etcd cluster not serving with one leader within %v: %w", timeout, last)
	}
	return leader, nil
}

func keys(m map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// enableAuth creates the root user and turns authentication on.
func (c *Cluster) enableAuth(password string) error {
	cli, err := c.Members[0].client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := cli.UserAdd(ctx, RootUser, password); err != nil {
		return fmt.Errorf("add user %s: %w", RootUser, err)
	}
	if _, err := cli.UserGrantRole(ctx, RootUser, "root"); err != nil {
		return fmt.Errorf("grant root role: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("enable auth: %w", err)
	}
	c.Username, c.Password = RootUser, password
	return nil
}

// LogTails returns the last n log lines of every member.
func (c *Cluster) LogTails(n int) string {
	var b strings.Builder
	for _, m := range c.Members {
		fmt.Fprintf(&b, "--- etcd member %s (%s) ---\n%s\n", m.Name, m.Addr, m.LogTail(n))
	}
	return b.String()
}

// Close kills every member and gives its ports back. A nil cluster is fine.
func (c *Cluster) Close() {
	if c == nil {
		return
	}
	for _, m := range c.Members {
		m.Kill()
		freeport.Give(m.ports...)
	}
	if c.netns != nil {
		c.netns.close()
	}
}

// Cluster returns the cluster the member belongs to (for Start's single member).
func (m *Member) Cluster() *Cluster { return m.cluster }
