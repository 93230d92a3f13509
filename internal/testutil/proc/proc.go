// Package proc tracks a server process a test harness started, so that the
// harnesses of every store (ZooKeeper, etcd, ...) inject the same faults the
// same way: kill it (SIGKILL), pause it (SIGSTOP) and resume it (SIGCONT),
// and tell whether it runs.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
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

// Pause sends SIGSTOP and returns once every thread of the process has
// stopped: the process keeps its ports and data but answers nothing, like a
// server behind a partition or in a long GC pause.
func (p *Process) Pause() error {
	if err := p.signal(syscall.SIGSTOP, true); err != nil {
		return err
	}
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	return WaitStopped(pid)
}

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

// stopTimeout bounds WaitStopped; a loaded machine stops a process within
// milliseconds.
const stopTimeout = 10 * time.Second

// WaitStopped returns once every thread of process pid is stopped (or gone).
//
// kill(SIGSTOP) returns before the process has stopped: the kernel wakes one
// thread, which then stops the others. Until that thread runs, the others
// keep serving, and on a busy machine that is milliseconds: long enough for a
// test that paused a server to get an answer from it.
func WaitStopped(pid int) error {
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, stopTimeout, true,
		func(context.Context) (bool, error) {
			running, err := runningThread(pid)
			if err != nil {
				return false, err
			}
			last = running
			return running == "", nil
		})
	if err != nil {
		return fmt.Errorf("process %d not stopped within %v after SIGSTOP (thread %s still runs): %w", pid, stopTimeout, last, err)
	}
	return nil
}

// runningThread returns a thread of pid that is not stopped, "" when none is.
// A process that is gone has no running thread.
func runningThread(pid int) (string, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		path := fmt.Sprintf("%s/%d/stat", dir, tid)
		b, err := os.ReadFile(path) //nolint:gosec // G703: a /proc path built from two integers
		if err != nil {
			continue // the thread exited meanwhile
		}
		// "tid (comm) S ...": comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return "", fmt.Errorf("unexpected %s: %q", path, b)
		}
		switch b[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return t.Name(), nil
		}
	}
	return "", nil
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
