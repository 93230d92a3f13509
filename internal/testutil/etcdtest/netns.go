package etcdtest

// Members in network namespaces (WithNetns), so that one member can be cut
// off from its peers while the test's clients still reach it.
//
// Each cluster gets a bridge in the root namespace holding 10.213.X.1/24 (X
// free on this machine) and one namespace per member, joined to the bridge
// by a veth pair, with the address 10.213.X.(10+i). The test process reaches
// every member's client URL through the bridge; the members reach each other
// across it. IsolatePeers drops, with iptables inside the member's namespace,
// every packet from or to the other members' addresses; the bridge address
// (the test's clients) is not matched.
//
// The names carry the test process's pid (base 36) and a sequence number:
// bridge lwb<pid>-<seq>, host veth ends lwv<pid>-<seq>-<i>, namespaces
// lwetcd-<pid>-<seq>-m<i>. Setting up a cluster first removes the ones of
// processes that are gone (a test binary killed before its cleanups), and
// holds a lock file meanwhile so that parallel test binaries pick different
// subnets.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

const (
	netnsPrefix  = "lwetcd-"
	bridgePrefix = "lwb"
	vethPrefix   = "lwv"
	// subnetBase is the /16 the clusters' /24 subnets are taken from.
	subnetBase = "10.213."
	// netnsClientPort and netnsPeerPort are every namespaced member's
	// ports: each has its own address, so they need not be free ports.
	netnsClientPort = 2379
	netnsPeerPort   = 2380
)

// WithNetns starts every member in its own network namespace with its own
// address on a bridge (see Cluster.IsolatePeers). It needs root and the ip
// command: call RequireNetns first. Not supported with WithTLS.
func WithNetns() Option { return func(o *options) { o.netns = true } }

var (
	netnsOnce sync.Once
	netnsErr  error
	netnsSeq  atomic.Int64
)

// RequireNetns skips t (as Require does) under -short or without etcd, and
// when network namespaces cannot be made here: not root, no ip command, or
// `ip netns add` fails.
func RequireNetns(t testing.TB) {
	t.Helper()
	Require(t)
	netnsOnce.Do(func() { netnsErr = probeNetns() })
	if netnsErr != nil {
		t.Skipf("network namespaces unavailable (WithNetns needs root and a working `ip netns add`): %v", netnsErr)
	}
}

func probeNetns() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return err
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return err
	}
	name := fmt.Sprintf("%s%s-probe", netnsPrefix, strconv.FormatInt(int64(os.Getpid()), 36))
	if err := ipCmd("netns", "add", name); err != nil {
		return err
	}
	return ipCmd("netns", "delete", name)
}

// ipCmd runs ip with args and returns its output in the error when it fails.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// nsCmd runs name with args inside namespace ns.
func nsCmd(ns, name string, args ...string) error {
	return ipCmd(append([]string{"netns", "exec", ns, name}, args...)...)
}

// netns is one cluster's bridge and namespaces.
type netns struct {
	tag    string // <pid>-<seq>
	bridge string
	subnet string // 10.213.X.
	n      int    // members
	mu     sync.Mutex
	closed bool
}

func (n *netns) namespace(i int) string { return fmt.Sprintf("%s%s-m%d", netnsPrefix, n.tag, i+1) }
func (n *netns) veth(i int) string      { return fmt.Sprintf("%s%s-%d", vethPrefix, n.tag, i+1) }
func (n *netns) addr(i int) string      { return n.subnet + strconv.Itoa(10+i+1) }

// setupNetns makes the bridge and n namespaces.
func setupNetns(members int) (*netns, error) {
	unlock, err := lockNetns()
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeStaleNetns()
	subnet, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	pid := strconv.FormatInt(int64(os.Getpid()), 36)
	n := &netns{tag: pid + "-" + strconv.FormatInt(netnsSeq.Add(1), 36), subnet: subnet, n: members}
	n.bridge = bridgePrefix + n.tag
	if len(n.veth(members-1)) > 15 {
		return nil, fmt.Errorf("interface name %s is longer than 15 bytes", n.veth(members-1))
	}
	steps := [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", subnet + "1/24", "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	}
	for i := range members {
		ns, veth := n.namespace(i), n.veth(i)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"link", "set", veth, "master", n.bridge},
			[]string{"link", "set", veth, "up"},
			[]string{"-n", ns, "addr", "add", n.addr(i) + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

// close removes the namespaces, veths and the bridge (the members must be
// gone: a namespace lives on while a process runs in it). Idempotent.
func (n *netns) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.closed = true
	for i := range n.n {
		_ = ipCmd("netns", "delete", n.namespace(i))
		_ = ipCmd("link", "delete", n.veth(i)) // gone with its namespace, usually
	}
	_ = ipCmd("link", "delete", n.bridge)
}

// lockNetns takes an exclusive lock shared by every test process of this
// machine (stale removal and subnet choice).
func lockNetns() (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), "lockwarden-etcdtest-netns.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// ownerGone reports whether the pid (base 36) at the start of a name's tag
// names no running process.
func ownerGone(tag string) bool {
	pidStr, _, _ := strings.Cut(tag, "-")
	pid, err := strconv.ParseInt(pidStr, 36, 64)
	if err != nil || pid <= 0 {
		return false
	}
	if int(pid) == os.Getpid() {
		return false
	}
	_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
	return errors.Is(err, os.ErrNotExist)
}

// removeStaleNetns removes the namespaces, bridges and veths of test
// processes that are gone.
func removeStaleNetns() {
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for line := range strings.Lines(string(out)) {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			if tag, ok := strings.CutPrefix(fields[0], netnsPrefix); ok && ownerGone(tag) {
				_ = ipCmd("netns", "delete", fields[0])
			}
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return
	}
	for _, ifc := range ifaces {
		for _, p := range []string{vethPrefix, bridgePrefix} {
			if tag, ok := strings.CutPrefix(ifc.Name, p); ok && ownerGone(tag) {
				_ = ipCmd("link", "delete", ifc.Name)
			}
		}
	}
}

// freeSubnet returns "10.213.X." for an X no interface of the root
// namespace has an address in.
func freeSubnet() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	used := map[string]bool{}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip4 := ipn.IP.To4(); ip4 != nil {
				used[fmt.Sprintf("%d.%d.%d.", ip4[0], ip4[1], ip4[2])] = true
			}
		}
	}
	start := os.Getpid() % 250
	for k := range 250 {
		s := subnetBase + strconv.Itoa(1+(start+k)%250) + "."
		if !used[s] {
			return s, nil
		}
	}
	return "", fmt.Errorf("no free /24 in %s0.0/16", subnetBase)
}

// IsolatePeers drops every packet between m and the other members (iptables
// in m's namespace) until heal is called (a second call does nothing), while the test's clients in the
// root namespace still reach m: a member cut off from its peers with its
// clients attached. The cluster must have been started WithNetns. Open
// peer connections hang (no reset), as behind a real partition.
func (c *Cluster) IsolatePeers(m *Member) (heal func() error, err error) {
	if c.netns == nil {
		return nil, errors.New("IsolatePeers needs a cluster started WithNetns")
	}
	var rules [][]string
	for _, o := range c.Members {
		if o == m {
			continue
		}
		rules = append(rules,
			[]string{"INPUT", "-s", o.host, "-j", "DROP"},
			[]string{"OUTPUT", "-d", o.host, "-j", "DROP"})
	}
	var added [][]string
	undo := func() error {
		var errs []error
		for _, r := range added {
			if err := nsCmd(m.netns, "iptables", append([]string{"-w", "-D"}, r...)...); err != nil {
				errs = append(errs, err)
			}
		}
		added = nil
		return errors.Join(errs...)
	}
	for _, r := range rules {
		if err := nsCmd(m.netns, "iptables", append([]string{"-w", "-A"}, r...)...); err != nil {
			return nil, errors.Join(err, undo())
		}
		added = append(added, r)
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			if err = undo(); err != nil {
				err = fmt.Errorf("heal the isolation of %s: %w", m.Name, err)
			}
		})
		return err
	}, nil
}
