package devcluster

import (
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
	"time"
)

// stopGrace is how long a process may take to exit after SIGTERM before it is killed.
const stopGrace = 10 * time.Second

// errPortTaken marks a start that failed because another process holds one
// of the ports the process was given: start it again on other ports.
var errPortTaken = errors.New("port taken by another process")

// process is one child process. Its output goes to a log file that survives
// restarts (appended to). It runs in its own process group, so that a Ctrl-C
// in the terminal reaches only the parent, which stops the children in
// order; and it gets SIGKILL when the parent dies (Pdeathsig), so nothing
// outlives a parent that was killed.
type process struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string
	// ports are the TCP ports the process must listen on to count as started.
	ports []int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.exited) {
		return fmt.Errorf("%s is already running (pid %d)", p.name, p.cmd.Process.Pid)
	}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "\n==> %s: starting %s\n", time.Now().Format(time.RFC3339), p.name)
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s (%s): %w", p.name, p.path, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.err = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !isClosed(p.exited)
}

// exitedErr returns an error when the process has exited, for readiness checks.
func (p *process) exitedErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s was not started", p.name)
	}
	if isClosed(p.exited) {
		for _, port := range p.ports {
			if !portFree(port) {
				return fmt.Errorf("%s exited (%w) and port %d is held by another process: %w; see %s", p.name, p.err, port, errPortTaken, p.logPath)
			}
		}
		return fmt.Errorf("%s exited (%w); see %s", p.name, p.err, p.logPath)
	}
	return nil
}

// listening returns nil when the process owns a listening socket on each of
// its ports: it, not some other process, is the one serving them.
func (p *process) listening() error {
	pid := p.pid()
	if pid == 0 {
		return fmt.Errorf("%s is not running", p.name)
	}
	for _, port := range p.ports {
		ok, err := listensOn(pid, port)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s (pid %d) is not listening on port %d", p.name, pid, port)
		}
	}
	return nil
}

// pid returns the process id, 0 when not running.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.exited) {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	p.signalAndWait(syscall.SIGKILL, 0)
}

// stop sends SIGTERM, waits up to stopGrace, then kills.
func (p *process) stop() {
	p.signalAndWait(syscall.SIGTERM, stopGrace)
}

func (p *process) signalAndWait(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || isClosed(exited) {
		return
	}
	_ = cmd.Process.Signal(sig)
	if sig != syscall.SIGKILL {
		select {
		case <-exited:
			return
		case <-time.After(grace):
		}
		_ = cmd.Process.Kill()
	}
	<-exited
}

func isClosed(c chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// portFree reports whether port can be bound on 127.0.0.1 right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// listensOn reports whether process pid holds a listening TCP socket on port.
// /proc/<pid>/net/tcp{,6} list the sockets of the process's network namespace
// with their inodes; a socket is the process's when one of its file
// descriptors links to socket:[inode].
func listensOn(pid, port int) (bool, error) {
	inodes := map[string]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && table == "tcp6" {
				continue // no IPv6
			}
			return false, err
		}
		for _, inode := range listeningInodes(string(data), port) {
			inodes[inode] = true
		}
	}
	if len(inodes) == 0 {
		return false, nil
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
			return true, nil
		}
	}
	return false, nil
}

// listeningInodes returns the inodes of the sockets in LISTEN state on port
// in a /proc/net/tcp or tcp6 table. A row reads
// "sl local_address rem_address st tx_queue:rx_queue tr:when retrnsmt uid timeout inode ...",
// with the local address as hexadecimal IP:port and LISTEN as st 0A.
func listeningInodes(table string, port int) []string {
	var out []string
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
			out = append(out, f[9])
		}
	}
	return out
}
