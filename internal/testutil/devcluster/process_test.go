package devcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
)

// helperListenEnv makes the test binary, run as a child, a server that
// listens on the port it names, or exits with status 3 when it cannot.
const helperListenEnv = "DEVCLUSTER_TEST_LISTEN"

func TestMain(m *testing.M) {
	if port := os.Getenv(helperListenEnv); port != "" {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(4)
			}
			_ = c.Close()
		}
	}
	os.Exit(m.Run())
}

// listener holds a loopback port for the test, as another program would.
func listener(t *testing.T) (net.Listener, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// helper makes a child process that listens on port.
func helper(t *testing.T, c *Cluster, port int) *process {
	t.Helper()
	p := c.newProcess("helper", os.Args[0], nil, []int{port}, helperListenEnv+"="+strconv.Itoa(port))
	t.Cleanup(p.kill)
	return p
}

func TestListensOn(t *testing.T) {
	_, port := listener(t)
	if ok, err := listensOn(os.Getpid(), port); err != nil || !ok {
		t.Fatalf("listensOn(self, %d) = %v, %v; want true", port, ok, err)
	}
	l2, other := listener(t)
	_ = l2.Close()
	if ok, err := listensOn(os.Getpid(), other); err != nil || ok {
		t.Fatalf("listensOn(self, closed port %d) = %v, %v; want false", other, ok, err)
	}

	c := &Cluster{logDir: t.TempDir()}
	l3, free := listener(t)
	_ = l3.Close()
	p := helper(t, c, free)
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitFor(context.Background(), p, "helper", func(context.Context) (bool, error) { return true, nil }); err != nil {
		t.Fatal(err)
	}
	if ok, err := listensOn(os.Getpid(), free); err != nil || ok {
		t.Fatalf("listensOn(self, %d) = %v, %v; want false: the child holds it", free, ok, err)
	}
}

// TestWaitForSeesPortTaken starts a process on a port another program holds:
// the wait must fail at once with errPortTaken, whatever the readiness
// check says (here: always ready, as a health check another server answers).
func TestWaitForSeesPortTaken(t *testing.T) {
	_, port := listener(t)
	c := &Cluster{logDir: t.TempDir()}
	p := helper(t, c, port)
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	err := c.waitFor(context.Background(), p, "helper", func(context.Context) (bool, error) { return true, nil })
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("waitFor = %v, want errPortTaken", err)
	}
}

// TestOnFreePortsMovesOn hands a component a port another program holds
// first: it must end up started, and listening, on another port.
func TestOnFreePortsMovesOn(t *testing.T) {
	_, taken := listener(t)
	c := &Cluster{logDir: t.TempDir()}
	var tried []int
	var last *process
	err := c.onFreePorts("helper", []int{taken}, 1, func(ports []int) error {
		tried = append(tried, ports[0])
		last = helper(t, c, ports[0])
		if err := last.start(); err != nil {
			return err
		}
		return c.waitFor(context.Background(), last, "helper", func(context.Context) (bool, error) { return true, nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tried) != 2 || tried[0] != taken || tried[1] == taken {
		t.Fatalf("ports tried = %v, want %d and then another", tried, taken)
	}
	if ok, err := listensOn(last.pid(), tried[1]); err != nil || !ok {
		t.Fatalf("the started process does not listen on %d: %v, %v", tried[1], ok, err)
	}
}

// TestOnFreePortsStopsOnOtherFailures keeps a process that fails for another
// reason than a taken port from being started again and again.
func TestOnFreePortsStopsOnOtherFailures(t *testing.T) {
	c := &Cluster{logDir: t.TempDir()}
	attempts := 0
	err := c.onFreePorts("false", nil, 1, func(ports []int) error {
		attempts++
		p := c.newProcess("false", "/bin/false", nil, ports)
		if err := p.start(); err != nil {
			return err
		}
		return c.waitFor(context.Background(), p, "false", func(context.Context) (bool, error) { return true, nil })
	})
	if err == nil || errors.Is(err, errPortTaken) || attempts != 1 {
		t.Fatalf("after %d attempts: %v; want one attempt and an error that is not errPortTaken", attempts, err)
	}
}

func TestListeningInodes(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 333 1 0000000000000000 100 0 0 10 0
`
	got := listeningInodes(table, 0x1F90)
	if len(got) != 1 || got[0] != "111" {
		t.Fatalf("listeningInodes = %v, want [111] (the LISTEN row of port 8080 only)", got)
	}
}
