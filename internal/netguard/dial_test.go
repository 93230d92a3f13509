package netguard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// listen opens a TCP listener on 127.0.0.1 that nothing accepts from: the
// test accepts itself, so the accept queue shows which connections were made.
func listen(t *testing.T) (*net.TCPListener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.(*net.TCPListener), ln.Addr().String()
}

// assertNothingConnected proves that no dial so far reached the listener: it
// connects once more and writes a marker; connections are queued in the order
// they were made, so the first one accepted must be the marker's.
func assertNothingConnected(t *testing.T, ln *net.TCPListener) {
	t.Helper()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("marker")); err != nil {
		t.Fatal(err)
	}
	_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 6)
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "marker" {
		t.Fatalf("the first connection the listener accepted was not the marker's (read %q, %v): a denied dial connected", buf, err)
	}
}

// fakeDNS answers lookups from a table for the duration of the test.
func fakeDNS(t *testing.T, table map[string][]string) {
	t.Helper()
	old := lookupNetIP
	t.Cleanup(func() { lookupNetIP = old })
	lookupNetIP = func(_ context.Context, _, host string) ([]netip.Addr, error) {
		addrs, ok := table[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var out []netip.Addr
		for _, a := range addrs {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
}

func dialWith(p *EndpointPolicy, tlsCfg *tls.Config, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return Dialer(DialOptions{Policy: p, TLS: tlsCfg, Timeout: 5 * time.Second})(ctx, "tcp", addr)
}

func wantDenied(t *testing.T, addr string, conn net.Conn, err error, class string) {
	t.Helper()
	if conn != nil {
		_ = conn.Close()
	}
	var de *DeniedError
	if !errors.As(err, &de) || !strings.HasPrefix(de.Reason, class) || !errors.Is(err, ErrDenied) {
		t.Fatalf("dial %s: %v, want a denial (%s)", addr, err, class)
	}
}

func TestDeniedDialMakesNoConnection(t *testing.T) {
	ln, addr := listen(t)
	_, port, _ := net.SplitHostPort(addr)
	fakeDNS(t, map[string][]string{
		"redis.tenant.example":   {"127.0.0.1"},
		"mapped.tenant.example":  {"::ffff:127.0.0.1"},
		"rebound.tenant.example": {"10.0.0.5", "127.0.0.1"},
	})
	def := mustPolicy(t, nil, nil)
	patterns := mustPolicy(t, []string{"*.tenant.example"}, nil)
	cidr := mustPolicy(t, []string{"10.0.0.0/8"}, nil)
	cases := []struct {
		p     *EndpointPolicy
		addr  string
		class string
	}{
		{def, "127.0.0.1:" + port, classLoopback},
		{def, "localhost:" + port, classLoopback},
		{def, "[::ffff:127.0.0.1]:" + port, classLoopback},
		{def, "redis.tenant.example:" + port, classLoopback},       // DNS points at loopback
		{patterns, "redis.tenant.example:" + port, classLoopback},  // a matching name does not lift the default deny
		{patterns, "mapped.tenant.example:" + port, classLoopback}, // nor a mapped answer
		{cidr, "rebound.tenant.example:" + port, classLoopback},    // every answer must pass
		{mustPolicy(t, []string{"127.0.0.1/32"}, []string{"127.0.0.1"}), "127.0.0.1:" + port, classDenyList},
	}
	for _, tc := range cases {
		conn, err := dialWith(tc.p, nil, tc.addr)
		wantDenied(t, tc.addr, conn, err, tc.class)
	}
	// The dial-time hook on its own: a plain dialer with it never connects.
	d := net.Dialer{ControlContext: def.control("redis.tenant.example:"+port, true)}
	if conn, err := d.Dial("tcp", addr); !errors.Is(err, ErrDenied) {
		if conn != nil {
			_ = conn.Close()
		}
		t.Fatalf("dial with the control hook: %v, want a denial", err)
	}
	assertNothingConnected(t, ln)
}

func TestAllowedDialConnects(t *testing.T) {
	ln, addr := listen(t)
	_, port, _ := net.SplitHostPort(addr)
	fakeDNS(t, map[string][]string{"redis.tenant.example": {"::ffff:127.0.0.1"}})
	p := mustPolicy(t, []string{"127.0.0.1/32"}, nil)
	for _, a := range []string{addr, "redis.tenant.example:" + port} {
		conn, err := dialWith(p, nil, a)
		if err != nil {
			t.Fatalf("dial %s with 127.0.0.1/32 allowed: %v", a, err)
		}
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		srv, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 7)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "+PONG\r\n" {
			t.Fatalf("read through the guarded connection: %q, %v", buf, err)
		}
		_ = srv.Close()
		_ = conn.Close()
	}
	// A nil policy allows everything.
	conn, err := dialWith(nil, nil, addr)
	if err != nil {
		t.Fatalf("dial with no policy: %v", err)
	}
	_ = conn.Close()
}

func TestDialerReportsHostNotFoundAndRefused(t *testing.T) {
	fakeDNS(t, map[string][]string{})
	p := mustPolicy(t, nil, nil)
	// The errors are the network's own, which backend.Category maps
	// (HostNotFound, ConnectionRefused).
	_, err := dialWith(p, nil, "missing.tenant.example:6379")
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Fatalf("unknown host: %v, want a *net.DNSError (not found)", err)
	}
	ln, addr := listen(t)
	_ = ln.Close()
	_, err = dialWith(mustPolicy(t, []string{"127.0.0.1/32"}, nil), nil, addr)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("closed port: %v, want ECONNREFUSED", err)
	}
}

// tlsServer serves TLS with a certificate for hosts, answering every read
// with reply, until the test ends.
func tlsServer(t *testing.T, hosts []string, reply string) (addr string, roots *x509.CertPool) {
	t.Helper()
	ca, err := testpki.NewCA("netguard test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(testpki.Leaf{CommonName: hosts[0], Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go serve(ln, func(c net.Conn) {
		buf := make([]byte, 1024)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	return ln.Addr().String(), roots
}

// serve runs handle on every connection until the listener is closed.
func serve(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

func TestDialerTLS(t *testing.T) {
	addr, roots := tlsServer(t, []string{"redis.tenant.example"}, "$1073741824\r\n")
	_, port, _ := net.SplitHostPort(addr)
	fakeDNS(t, map[string][]string{"redis.tenant.example": {"127.0.0.1"}})
	p := mustPolicy(t, []string{"127.0.0.1/32"}, nil)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}

	// ServerName defaults to the host dialed, and the caller's config is not changed.
	conn, err := dialWith(p, cfg, "redis.tenant.example:"+port)
	if err != nil {
		t.Fatalf("TLS dial by name: %v", err)
	}
	defer conn.Close()
	if cfg.ServerName != "" {
		t.Fatalf("the dialer changed the caller's tls.Config (ServerName %q)", cfg.ServerName)
	}
	// The dialer reads nothing itself: what the server sends comes through
	// the plaintext side of TLS untouched (the Redis engine bounds replies
	// on top of it, lock/redis's LimitReplies).
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len("$1073741824\r\n"))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "$1073741824\r\n" {
		t.Fatalf("reading over TLS: %q, %v; want the server's bytes untouched", buf, err)
	}

	// By IP, the certificate (for the name only) does not verify.
	_, err = dialWith(p, cfg, addr)
	var he *HandshakeError
	if !errors.As(err, &he) || he.Endpoint != addr {
		t.Fatalf("TLS dial by IP with a certificate for a name: %v, want a *HandshakeError", err)
	}

	// A plaintext peer fails the handshake too.
	ln, plainAddr := listen(t)
	go serve(ln, func(c net.Conn) { _, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n")); _, _ = io.Copy(io.Discard, c) })
	_, err = dialWith(p, cfg, plainAddr)
	if !errors.As(err, &he) || he.Endpoint != plainAddr {
		t.Fatalf("TLS dial to an SSH server: %v, want a *HandshakeError", err)
	}
}

func TestDialerDeniesOtherNetworks(t *testing.T) {
	_, err := Dialer(DialOptions{Policy: mustPolicy(t, nil, nil)})(context.Background(), "unix", "/var/run/redis.sock")
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("unix socket under a policy: %v, want a denial", err)
	}
}
