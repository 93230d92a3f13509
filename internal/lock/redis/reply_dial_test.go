package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// TestDialBoundsRepliesOverTLS: the Locker's dialer (netguard's, wrapped by
// limitingReplies) checks the replies on the plaintext side of TLS: a server
// announcing a 1 GiB bulk over TLS fails the read, before the client
// allocates for it.
func TestDialBoundsRepliesOverTLS(t *testing.T) {
	ca, err := testpki.NewCA("redis reply test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(testpki.Leaf{CommonName: "127.0.0.1", Hosts: []string{"127.0.0.1"}})
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
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write([]byte("$1073741824\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	dial := limitingReplies(netguard.Dialer(netguard.DialOptions{Policy: policy, TLS: tlsCfg, Timeout: 5 * time.Second}), replyLimits)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer conn.Close()
	if _, ok := conn.(*tls.Conn); ok {
		t.Fatal("the connection is the bare TLS one: replies are not checked")
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var re *ReplyError
	if _, err := io.ReadAll(conn); !errors.Is(err, ErrReplyTooLarge) || !errors.As(err, &re) || re.Limit != "MaxBulk" {
		t.Fatalf("reading an oversized reply over TLS: %v, want ErrReplyTooLarge (MaxBulk)", err)
	}
	// A denied address is refused before any connection, as for every store.
	if _, err := limitingReplies(netguard.Dialer(netguard.DialOptions{Policy: mustDenyAll(t)}), replyLimits)(ctx, "tcp", ln.Addr().String()); !errors.Is(err, netguard.ErrDenied) {
		t.Fatalf("dial under the default policy: %v, want ErrDenied", err)
	}
}

// mustDenyAll is the default policy (loopback denied).
func mustDenyAll(t *testing.T) *netguard.EndpointPolicy {
	t.Helper()
	p, err := netguard.NewEndpointPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
