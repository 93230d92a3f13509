package netguard

import (
	"context"
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

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
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

const secret = "SSH-2.0-OpenSSH_9.6 secret-banner"

func opErr(err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 6379}, Err: os.NewSyscallError("connect", err)}
}

func TestCategory(t *testing.T) {
	denied := &DeniedError{Endpoint: "169.254.169.254:80", Reason: classLinkLocal + ": 169.254.169.254"}
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
		{&HandshakeError{Endpoint: "a:1", Err: x509.UnknownAuthorityError{}}, CategoryTLSHandshakeFailed},
		{&HandshakeError{Endpoint: "a:1", Err: io.EOF}, CategoryTLSHandshakeFailed},
		{&HandshakeError{Endpoint: "a:1", Err: context.DeadlineExceeded}, CategoryTimeout},
		{x509.HostnameError{Certificate: &x509.Certificate{}, Host: "redis"}, CategoryTLSHandshakeFailed},
		{x509.HostnameError{}, CategoryTLSHandshakeFailed}, // its Error panics: Category must not
		{fmt.Errorf("failed to authenticate: %w", redisErr("WRONGPASS invalid username-password pair or user is disabled.")), CategoryAuthenticationFailed},
		{redisErr("NOAUTH Authentication required."), CategoryAuthenticationFailed},
		{redisErr("ERR invalid password"), CategoryAuthenticationFailed},
		{redisErr("ERR AUTH <password> called without any password configured for the default user."), CategoryAuthenticationFailed},
		{redisErr("READONLY You can't write against a read only replica."), CategoryReadOnlyReplica},
		{redisErr("LOADING Redis is loading the dataset in memory"), CategoryLoading},
		{redisErr("OOM command not allowed when used memory > 'maxmemory'."), CategoryOutOfMemory},
		{redisErr("ERR " + secret), CategoryServerError},
		{redisErr("NOSCRIPT No matching script."), CategoryServerError},
		{&ReplyError{Reason: "x", kind: ErrNotRedis}, CategoryNotRedis},
		{&ReplyError{Reason: "x", kind: ErrUnsupportedReply}, CategoryNotRedis},
		{&ReplyError{Reason: "x", Limit: "MaxBulk", kind: ErrReplyTooLarge}, CategoryReplyTooLarge},
		{fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, &lock.NodeError{Node: "pg:5432", Err: &lock.ReplyTooLargeError{Store: "postgres", Declared: 1 << 30, Limit: 4 << 20}}), CategoryReplyTooLarge},
		// The oversized reply is the root cause of the timeout that follows it.
		{fmt.Errorf("ping: %w", errors.Join(context.DeadlineExceeded, &lock.ReplyTooLargeError{Store: "zookeeper"})), CategoryReplyTooLarge},
		{fmt.Errorf("ping: %w", fmt.Errorf("redis: invalid reply: %q", secret)), CategoryNotRedis},
		{fmt.Errorf("redis: can't parse %.100q", secret), CategoryNotRedis},
		{&strconv.NumError{Func: "ParseInt", Num: secret, Err: strconv.ErrSyntax}, CategoryNotRedis},
		{io.EOF, CategoryConnectionClosed},
		{io.ErrUnexpectedEOF, CategoryConnectionClosed},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, CategoryConnectionClosed},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, CategoryConnectionClosed},
		{net.ErrClosed, CategoryConnectionClosed},
		{errors.New(secret), CategoryUnavailable},
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

func TestDescribe(t *testing.T) {
	node := func(name string, err error) error { return &lock.NodeError{Node: name, Err: err} }
	denied := &DeniedError{Endpoint: "10.0.0.9:6379", Reason: classDenyList + ": 10.0.0.9"}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"no node", errors.New(secret), CategoryUnavailable},
		{"no node, known cause", fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, io.EOF), CategoryConnectionClosed},
		{"one node", fmt.Errorf("%w: ping: %w", lock.ErrBackendUnavailable, errors.Join(node("10.0.0.7:6379", fmt.Errorf("ping: %w", opErr(syscall.ECONNREFUSED))))),
			"10.0.0.7:6379: ConnectionRefused"},
		{"quorum", &quorumErr{errors.Join(
			node("10.0.0.7:6379", opErr(syscall.ECONNREFUSED)),
			node("10.0.0.8:6379", context.DeadlineExceeded),
			node("10.0.0.9:6379", opErr(denied)),
			node("10.0.0.10:6379", &ReplyError{Reason: "x", kind: ErrNotRedis}),
			node("10.0.0.11:6379", fmt.Errorf("acquire script: %w", redisErr("ERR "+secret))),
		)}, "10.0.0.7:6379: ConnectionRefused; 10.0.0.8:6379: Timeout; 10.0.0.9:6379: DeniedByPolicy (API server or operator address (deny list): 10.0.0.9); 10.0.0.10:6379: NotRedis; 10.0.0.11:6379: ServerError"},
		{"busy nodes are left out", &quorumErr{errors.Join(
			node("a:1", &lock.HeldError{Key: "k", Holder: "h"}),
			node("b:1", io.EOF),
			errors.New("the acquisition took too long"),
		)}, "b:1: ConnectionClosed"},
		{"unknown node cause", node("a:1", errors.New(secret)), "a:1: Unavailable"},
		{"denial without a node", denied, "DeniedByPolicy (API server or operator address (deny list): 10.0.0.9)"},
	}
	for _, tc := range cases {
		got := Describe(tc.err)
		if got != tc.want {
			t.Errorf("%s: Describe = %q, want %q", tc.name, got, tc.want)
		}
		if strings.Contains(got, "SSH") || strings.Contains(got, "secret") {
			t.Errorf("%s: Describe shows the text of an error: %q", tc.name, got)
		}
	}
	if got := Describe(nil); got != "" {
		t.Errorf("Describe(nil) = %q", got)
	}
}
