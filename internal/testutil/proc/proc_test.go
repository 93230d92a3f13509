package proc

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
)

const spinEnv = "LOCKWARDEN_PROC_TEST_SPIN"

// TestMain turns the test binary into a busy server when spinEnv is set: a
// thread per CPU, each running user code all the time, which is when SIGSTOP
// takes longest to stop every thread.
func TestMain(m *testing.M) {
	if os.Getenv(spinEnv) != "" {
		for range runtime.NumCPU() * 2 {
			go func() {
				for n := 0; ; n++ {
					_ = n
				}
			}()
		}
		select {}
	}
	os.Exit(m.Run())
}

func TestPauseReturnsOnceEveryThreadStopped(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), spinEnv+"=1")
	var p Process
	if _, err := p.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	for range 20 {
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
		if tid, err := runningThread(cmd.Process.Pid); err != nil || tid != "" {
			t.Fatalf("after Pause returned, thread %q still runs (%v)", tid, err)
		}
		if !p.Running() || !p.Paused() {
			t.Fatalf("running %v, paused %v; want a paused live process", p.Running(), p.Paused())
		}
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	p.Kill()
	if p.Running() {
		t.Fatal("still running after Kill")
	}
	if err := WaitStopped(cmd.Process.Pid); err != nil {
		t.Fatalf("WaitStopped on a process that is gone: %v", err)
	}
}
