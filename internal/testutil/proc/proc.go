// Package proc tracks a server process a test harness started, so that the
// harnesses of every store (ZooKeeper, etcd, ...) inject the same faults the
// same way: kill it (SIGKILL), pause it (SIGSTOP) and resume it (SIGCONT),
// and tell whether it runs.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// Process is one run of a server at a time; the zero value has none. It is
// safe for concurrent use.
type Process struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

// Start starts cmd as the current run and returns a channel closed when it
// has exited.
func (p *Process) Start(cmd *exec.Cmd) (<-chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited, p.paused = cmd, exited, false
	p.mu.Unlock()
	return exited, nil
}

// Running reports whether the current run is alive (paused counts as alive).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Paused reports whether the process was paused and not resumed.
func (p *Process) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Kill sends SIGKILL (after SIGCONT, if paused) and waits for the process
// to be gone.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, exited, paused := p.cmd, p.exited, p.paused
	p.paused = false
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Pause sends SIGSTOP: the process keeps its ports and data but answers
// nothing, like a server behind a partition or in a long GC pause.
func (p *Process) Pause() error { return p.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused process.
func (p *Process) Resume() error { return p.signal(syscall.SIGCONT, false) }

func (p *Process) signal(sig syscall.Signal, paused bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("signal %v to a process that never started", sig)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v: %w", sig, err)
	}
	p.paused = paused
	return nil
}

// Tail returns the last n lines of the file at path (a server's log); ""
// when it cannot be read.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
