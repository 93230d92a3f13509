// Package rawserver runs a TCP server on loopback whose every connection is
// handled by the test's own function: a stand-in for a store run by a
// hostile tenant, which sends what no real server would.
package rawserver

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Server is a listening fake server.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Host and Port are Addr's parts.
	Host string
	Port int

	accepted atomic.Int64
	ln       net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// Start listens on 127.0.0.1 and runs handle on every connection accepted,
// each in its own goroutine; the connection is closed when handle returns.
// The test's cleanup closes the listener and every open connection and waits
// for the handlers.
func Start(t testing.TB, handle func(c net.Conn)) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr)
	s := &Server{Addr: a.String(), Host: a.IP.String(), Port: a.Port, ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					_ = c.Close()
				}()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// Accepted returns the number of connections accepted so far.
func (s *Server) Accepted() int64 { return s.accepted.Load() }

// HeapSys returns the bytes of heap the Go runtime holds from the system. A
// reply-sized allocation shows in it even once collected (the runtime
// returns memory lazily), so tests compare it before and after: only growth
// counts.
func HeapSys() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapSys
}
