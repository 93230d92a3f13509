// Package freeport hands out loopback TCP ports for the servers a test starts.
//
// A port is found by listening on 127.0.0.1:0 and closing the listener, so it
// is only known to have been free a moment ago: another process may bind it
// before the server does, and whoever starts a server on it must confirm that
// its own process is the one listening (redistest checks INFO's process_id,
// devcluster the process's sockets). What this package adds is that one test
// process never hands out the same port twice while it is in use: a port stays
// taken until it is given back (Give), so parallel starts in one process, and a
// server that was killed and will be restarted on its port, do not collide.
package freeport

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// maxProbes bounds the listeners one call opens while skipping taken ports.
const maxProbes = 256

var (
	mu    sync.Mutex
	taken = map[int]bool{}
)

// Take returns a port on 127.0.0.1 that was free a moment ago and that this
// process has not handed out since, or has given back.
func Take() (int, error) {
	ports, err := TakeN(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// TakeN returns n distinct ports as Take does.
func TakeN(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	// Every listener stays open until all n ports are chosen, so the kernel
	// does not offer the same port twice within one call.
	var open []net.Listener
	defer func() {
		for _, l := range open {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for len(out) < n {
		if len(open) >= maxProbes+n {
			return nil, errors.New("find a free port: every port the kernel offered is already handed out")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		open = append(open, l)
		p := l.Addr().(*net.TCPAddr).Port
		if taken[p] {
			continue
		}
		taken[p] = true
		out = append(out, p)
	}
	return out, nil
}

// Claim marks port, chosen by the caller (a well-known port it prefers), as
// handed out. It reports false when this process already handed it out; the
// caller still has to check that no other process holds it.
func Claim(port int) bool {
	mu.Lock()
	defer mu.Unlock()
	if taken[port] {
		return false
	}
	taken[port] = true
	return true
}

// Give returns ports handed out by Take or TakeN, once nothing of this
// process will listen on them again.
func Give(ports ...int) {
	mu.Lock()
	defer mu.Unlock()
	for _, p := range ports {
		delete(taken, p)
	}
}
