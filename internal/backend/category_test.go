package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// redisErr is an error reply as go-redis returns it (a type with RedisError).
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

var _ goredis.Error = redisErr("")

// quorumErr wraps joined node errors as the Redlock engine's QuorumError does.
type quorumErr struct{ cause error }

func (e *quorumErr) Error() string { return "no quorum: " + e.cause.Error() }
func (e *quorumErr) Unwrap() error { return e.cause }

const peerBytes = "SSH-2.0-OpenSSH_9.6 secret-banner"

func opErr(err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 6379}, Err: os.NewSyscallError("connect", err)}
}

// streamConn is a net.Conn that reads a fixed stream, then EOF.
type streamConn struct {
	net.Conn // nil: only Read and Close are used
	r        *strings.Reader
}

func (c *streamConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *streamConn) Close() error               { return nil }

// replyError is what the Redis engine's reply validator (LimitReplies)
// returns for stream: a *redislock.ReplyError of the kind want.
func replyError(t *testing.T, stream string, want error) error {
	t.Helper()
	_, err := io.ReadAll(redislock.LimitReplies(&streamConn{r: strings.NewReader(stream)}, redislock.Limits{}))
	var re *redislock.ReplyError
	if !errors.As(err, &re) || !errors.Is(err, want) {
		t.Fatalf("reading %q through LimitReplies: %v, want a *ReplyError matching %v", stream, err, want)
	}
	return err
}

func TestCategory(t *testing.T) {
	denied := &netguard.DeniedError{Endpoint: "169.254.169.254:80", Reason: "link-local or cloud metadata address: 169.254.169.254"}
	cases := []struct {
		err  error
		want string
	}{
		{denied, CategoryDeniedByPolicy},
		{opErr(denied), CategoryDeniedByPolicy},
		{opErr(syscall.ECONNREFUSED), CategoryConnectionRefused},
		{opErr(syscall.ETIMEDOUT), CategoryTimeout},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, CategoryTimeout},
		{context.DeadlineExceeded, CategoryTimeout},
		{fmt.Errorf("ping: %w", context.DeadlineExceeded), CategoryTimeout},
		{goredis.ErrPoolTimeout, CategoryTimeout},
		{&net.DNSError{Err: "no such host", Name: "redis.tenant", IsNotFound: true}, CategoryHostNotFound},
		{&net.DNSError{Err: "server misbehaving", Name: "redis.tenant"}, CategoryHostNotFound},
		{&net.DNSError{Err: "i/o timeout", Name: "redis.tenant", IsTimeout: true}, CategoryTimeout},
		{&netguard.HandshakeError{Endpoint: "a:1", Err: x509.UnknownAuthorityError{}}, CategoryTLSHandshakeFailed},
		{&netguard.HandshakeError{Endpoint: "a:1", Err: io.EOF}, CategoryTLSHandshakeFailed},
		{&netguard.HandshakeError{Endpoint: "a:1", Err: context.DeadlineExceeded}, CategoryTimeout},
		{x509.HostnameError{Certificate: &x509.Certificate{}, Host: "redis"}, CategoryTLSHandshakeFailed},
		{x509.HostnameError{}, CategoryTLSHandshakeFailed}, // its Error panics: Category must not
		{fmt.Errorf("failed to authenticate: %w", redisErr("WRONGPASS invalid username-password pair or user is disabled.")), CategoryAuthenticationFailed},
		{redisErr("NOAUTH Authentication required."), CategoryAuthenticationFailed},
		{redisErr("ERR invalid password"), CategoryAuthenticationFailed},
		{redisErr("ERR AUTH <password> called without any password configured for the default user."), CategoryAuthenticationFailed},
		{redisErr("READONLY You can't write against a read only replica."), CategoryReadOnlyReplica},
		{redisErr("LOADING Redis is loading the dataset in memory"), CategoryLoading},
		{redisErr("OOM command not allowed when used memory > 'maxmemory'."), CategoryOutOfMemory},
		{redisErr("ERR " + peerBytes), CategoryServerError},
		{redisErr("NOSCRIPT No matching script."), CategoryServerError},
		{replyError(t, "SSH-2.0-OpenSSH_9.6\r\n", redislock.ErrNotRedis), CategoryNotRedis},
		{replyError(t, ";4\r\nabcd\r\n", redislock.ErrUnsupportedReply), CategoryNotRedis},
		{replyError(t, "$1073741824\r\n", redislock.ErrReplyTooLarge), CategoryReplyTooLarge},
		{fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, &lock.NodeError{Node: "pg:5432", Err: &lock.ReplyTooLargeError{Store: "postgres", Declared: 1 << 30, Limit: 4 << 20}}), CategoryReplyTooLarge},
		// The oversized reply is the root cause of the timeout that follows it.
		{fmt.Errorf("ping: %w", errors.Join(context.DeadlineExceeded, &lock.ReplyTooLargeError{Store: "zookeeper"})), CategoryReplyTooLarge},
		{fmt.Errorf("ping: %w", fmt.Errorf("redis: invalid reply: %q", peerBytes)), CategoryNotRedis},
		{fmt.Errorf("redis: can't parse %.100q", peerBytes), CategoryNotRedis},
		{&strconv.NumError{Func: "ParseInt", Num: peerBytes, Err: strconv.ErrSyntax}, CategoryNotRedis},
		{io.EOF, CategoryConnectionClosed},
		{io.ErrUnexpectedEOF, CategoryConnectionClosed},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, CategoryConnectionClosed},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, CategoryConnectionClosed},
		{net.ErrClosed, CategoryConnectionClosed},
		{errors.New(peerBytes), CategoryUnavailable},
		{lock.ErrBackendUnavailable, CategoryUnavailable},
		// Root causes outrank the caller's deadline.
		{fmt.Errorf("acquire: %w; last attempt: %w", context.DeadlineExceeded, opErr(syscall.ECONNREFUSED)), CategoryConnectionRefused},
		{fmt.Errorf("acquire: %w; last attempt: %w", context.DeadlineExceeded, denied), CategoryDeniedByPolicy},
	}
	for _, tc := range cases {
		if got := Category(tc.err); got != tc.want {
			t.Errorf("Category(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if got := Category(nil); got != "" {
		t.Errorf("Category(nil) = %q, want empty", got)
	}
}

func TestCategoriesAreTheContract(t *testing.T) {
	want := []string{"DeniedByPolicy", "ReplyTooLarge", "NotRedis", "TLSHandshakeFailed", "AuthenticationFailed",
		"ReadOnlyReplica", "Loading", "OutOfMemory", "ServerError", "HostNotFound", "ConnectionRefused",
		"ConnectionClosed", "Timeout", "Unavailable"}
	if got := Categories(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Categories() = %v, want %v", got, want)
	}
}

func TestDescribeNodes(t *testing.T) {
	node := func(name string, err error) error { return &lock.NodeError{Node: name, Err: err} }
	denied := &netguard.DeniedError{Endpoint: "10.0.0.9:6379", Reason: "API server or operator address (deny list): 10.0.0.9"}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"no node", errors.New(peerBytes), CategoryUnavailable},
		{"no node, known cause", fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, io.EOF), CategoryConnectionClosed},
		{"one node", fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, errors.Join(node("10.0.0.7:6379", fmt.Errorf("ping: %w", opErr(syscall.ECONNREFUSED))))),
			"10.0.0.7:6379: ConnectionRefused"},
		{"quorum", &quorumErr{errors.Join(
			node("10.0.0.7:6379", opErr(syscall.ECONNREFUSED)),
			node("10.0.0.8:6379", context.DeadlineExceeded),
			node("10.0.0.9:6379", opErr(denied)),
			node("10.0.0.10:6379", replyError(t, "SSH-2.0-OpenSSH_9.6\r\n", redislock.ErrNotRedis)),
			node("10.0.0.11:6379", fmt.Errorf("acquire script: %w", redisErr("ERR "+peerBytes))),
		)}, "10.0.0.7:6379: ConnectionRefused; 10.0.0.8:6379: Timeout; 10.0.0.9:6379: DeniedByPolicy (API server or operator address (deny list): 10.0.0.9); 10.0.0.10:6379: NotRedis; 10.0.0.11:6379: ServerError"},
		{"busy nodes are left out", &quorumErr{errors.Join(
			node("a:1", &lock.HeldError{Key: "k", Holder: "h"}),
			node("b:1", io.EOF),
			errors.New("the acquisition took too long"),
		)}, "b:1: ConnectionClosed"},
		{"unknown node cause", node("a:1", errors.New(peerBytes)), "a:1: Unavailable"},
		{"denial without a node", denied, "DeniedByPolicy (API server or operator address (deny list): 10.0.0.9)"},
	}
	for _, tc := range cases {
		got := describeNodes(tc.err)
		if got != tc.want {
			t.Errorf("%s: describeNodes = %q, want %q", tc.name, got, tc.want)
		}
		if strings.Contains(got, "SSH") || strings.Contains(got, "secret") {
			t.Errorf("%s: describeNodes shows the text of an error: %q", tc.name, got)
		}
	}
	if got := describeNodes(nil); got != "" {
		t.Errorf("describeNodes(nil) = %q", got)
	}
}

// TestCategoryOfDialErrors: the errors netguard's Dialer returns, on real
// connections, map to their categories, and a peer's bytes never reach the
// description.
func TestCategoryOfDialErrors(t *testing.T) {
	listen := func(handle func(net.Conn)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
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
					handle(c)
				}()
			}
		}()
		return ln.Addr().String()
	}
	dial := func(policy *netguard.EndpointPolicy, tlsCfg *tls.Config, addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := netguard.Dialer(netguard.DialOptions{Policy: policy, TLS: tlsCfg, Timeout: 5 * time.Second})(ctx, "tcp", addr)
		if err == nil {
			_ = conn.Close()
		}
		return err
	}
	loopbackDenied, err := netguard.NewEndpointPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sshAddr := listen(func(c net.Conn) { _, _ = c.Write([]byte(peerBytes + "\r\n")); _, _ = io.Copy(io.Discard, c) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	_ = ln.Close()
	cases := map[string]struct {
		err  error
		want string
	}{
		"denied":     {dial(loopbackDenied, nil, sshAddr), CategoryDeniedByPolicy},
		"closed":     {dial(nil, nil, closedAddr), CategoryConnectionRefused},
		"TLS to SSH": {dial(nil, &tls.Config{ServerName: "store", MinVersion: tls.VersionTLS12}, sshAddr), CategoryTLSHandshakeFailed},
	}
	for name, tc := range cases {
		if c := Category(tc.err); c != tc.want {
			t.Errorf("%s: Category = %s, want %s (err: %v)", name, c, tc.want, tc.err)
		}
		if d := describeNodes(tc.err); !strings.HasPrefix(d, tc.want) || strings.Contains(d, "SSH") || strings.Contains(d, "secret") {
			t.Errorf("%s: describeNodes = %q, want the category %s and none of the peer's bytes", name, d, tc.want)
		}
	}
}
