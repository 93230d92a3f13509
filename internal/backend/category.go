package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// Error categories: the fixed vocabulary Category and Describe map every
// error of a store (any of them: Redis, PostgreSQL, ZooKeeper, etcd) to.
// Most are about the endpoint and the network, whatever the store; those
// that name a Redis reply or the Redis protocol are only recognised on a
// Redis store. They are shown to users (status conditions, Events), so they
// are a contract: never rename one.
const (
	// CategoryDeniedByPolicy: the endpoint policy refused the address
	// (loopback, link-local or cloud metadata, the API server or the
	// operator, or not in the allow-list); no connection was made.
	CategoryDeniedByPolicy = "DeniedByPolicy"
	// CategoryConnectionRefused: nothing listens on the endpoint.
	CategoryConnectionRefused = "ConnectionRefused"
	// CategoryTimeout: the endpoint did not connect or answer in time
	// (context deadlines included).
	CategoryTimeout = "Timeout"
	// CategoryHostNotFound: the host name could not be resolved (DNS).
	CategoryHostNotFound = "HostNotFound"
	// CategoryTLSHandshakeFailed: the TLS handshake failed, certificate
	// verification included.
	CategoryTLSHandshakeFailed = "TLSHandshakeFailed"
	// CategoryAuthenticationFailed: the store refused the credentials
	// (recognised in Redis's replies: NOAUTH, WRONGPASS, invalid password).
	CategoryAuthenticationFailed = "AuthenticationFailed"
	// CategoryNotRedis: an endpoint of a Redis store does not speak the Redis
	// protocol (for example an SSH or HTTP server), or sent a reply the
	// client cannot read.
	CategoryNotRedis = "NotRedis"
	// CategoryReplyTooLarge: a reply announced more data than the operator
	// accepts from the store (Redis: bulk size, element count, line length
	// or nesting; PostgreSQL, ZooKeeper, etcd: the length of a message).
	CategoryReplyTooLarge = "ReplyTooLarge"
	// CategoryConnectionClosed: the connection was closed or reset by the peer.
	CategoryConnectionClosed = "ConnectionClosed"
	// CategoryReadOnlyReplica: the endpoint is a read-only Redis replica (READONLY).
	CategoryReadOnlyReplica = "ReadOnlyReplica"
	// CategoryLoading: Redis is loading its dataset (LOADING).
	CategoryLoading = "Loading"
	// CategoryOutOfMemory: Redis refused the write for lack of memory (OOM).
	CategoryOutOfMemory = "OutOfMemory"
	// CategoryServerError: Redis answered with another error reply (its text
	// is not shown).
	CategoryServerError = "ServerError"
	// CategoryUnavailable: any other failure.
	CategoryUnavailable = "Unavailable"
)

// Categories returns every category, in the order Category tries them.
func Categories() []string {
	out := make([]string, 0, len(rules)+1)
	for _, r := range rules {
		out = append(out, r.category)
	}
	return append(out, CategoryUnavailable)
}

// rules are tried in order: the first category any error of the tree
// matches wins, so root causes (a denial, a bad reply) outrank their
// consequences (a timeout of the caller's context).
var rules = []struct {
	category string
	match    func(error) bool
}{
	{CategoryDeniedByPolicy, func(e error) bool { return errors.Is(e, netguard.ErrDenied) }},
	{CategoryReplyTooLarge, func(e error) bool {
		return errors.Is(e, redislock.ErrReplyTooLarge) || errors.Is(e, lock.ErrReplyTooLarge)
	}},
	{CategoryNotRedis, isNotRedis},
	{CategoryTLSHandshakeFailed, isTLSFailure},
	{CategoryAuthenticationFailed, redisReply(isAuthReply)},
	{CategoryReadOnlyReplica, redisReply(prefix("READONLY"))},
	{CategoryLoading, redisReply(prefix("LOADING"))},
	{CategoryOutOfMemory, redisReply(prefix("OOM"))},
	{CategoryServerError, redisReply(func(string) bool { return true })},
	{CategoryHostNotFound, isHostNotFound},
	{CategoryConnectionRefused, func(e error) bool { return errors.Is(e, syscall.ECONNREFUSED) }},
	{CategoryConnectionClosed, isClosed},
	{CategoryTimeout, isTimeout},
}

// Category maps an error of a store's lock engine (or of netguard's Dialer,
// which every store dials through) to one of the Category constants; "" for
// nil. The categories are tried in the order of Categories over the whole
// error tree (wrapped and joined errors), so a root cause anywhere in it
// wins over, say, the caller's deadline; an error none matches is
// CategoryUnavailable. It is meant for backend failures (errors
// matching lock.ErrBackendUnavailable or lock.ErrQuorum): lock outcomes such
// as lock.ErrNotAcquired match no category, so check for them first.
func Category(err error) string {
	if err == nil {
		return ""
	}
	for _, r := range rules {
		if anyInTree(err, r.match) {
			return r.category
		}
	}
	return CategoryUnavailable
}

// describeNodes says, safely for users, why err happened: for each store node
// named in it (*lock.NodeError, possibly joined as in a Redlock quorum
// failure), "node: Category", joined with "; " in the order they appear;
// without node errors, just the category. A denial adds the policy's own
// reason in parentheses. The text never contains anything read from the
// network nor the text of an unknown error; node names are the endpoints as
// configured. Nodes that only report a lock outcome (a busy key) are left out.
func describeNodes(err error) string {
	if err == nil {
		return ""
	}
	var parts []string
	seen := map[string]bool{}
	walk(err, func(e error) bool {
		ne, ok := e.(*lock.NodeError) //nolint:errorlint // one node of the tree at a time; walk does the unwrapping
		if !ok {
			return true
		}
		if ne.Err == nil || errors.Is(ne.Err, lock.ErrNotAcquired) {
			return false
		}
		s := ne.Node + ": " + describeOne(ne.Err)
		if !seen[s] {
			seen[s] = true
			parts = append(parts, s)
		}
		return false
	})
	if len(parts) == 0 {
		return describeOne(err)
	}
	return strings.Join(parts, "; ")
}

func describeOne(err error) string {
	c := Category(err)
	if c == CategoryDeniedByPolicy {
		var de *netguard.DeniedError
		if errors.As(err, &de) && de.Reason != "" {
			return c + " (" + de.Reason + ")"
		}
	}
	return c
}

// walk visits the error tree depth first; visit returns false to skip the children of e.
func walk(err error, visit func(error) bool) {
	if err == nil || !visit(err) {
		return
	}
	switch u := err.(type) { //nolint:errorlint // this is the unwrapping
	case interface{ Unwrap() []error }:
		for _, c := range u.Unwrap() {
			walk(c, visit)
		}
	case interface{ Unwrap() error }:
		walk(u.Unwrap(), visit)
	}
}

func anyInTree(err error, match func(error) bool) bool {
	found := false
	walk(err, func(e error) bool {
		if !found && match(e) {
			found = true
		}
		return !found
	})
	return found
}

func isNotRedis(e error) bool {
	if errors.Is(e, redislock.ErrNotRedis) || errors.Is(e, redislock.ErrUnsupportedReply) {
		return true
	}
	var ne *strconv.NumError
	if errors.As(e, &ne) {
		return true // a number in a reply that does not parse
	}
	// go-redis's protocol errors are plain strings (followed by the peer's bytes).
	msg := errorText(e)
	for _, p := range []string{"redis: invalid reply", "redis: can't parse", "redis: invalid line", "redis: RESP3 map key"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func isTLSFailure(e error) bool {
	var he *netguard.HandshakeError
	if errors.As(e, &he) {
		return !isTimeout(he.Err)
	}
	var (
		rh  tls.RecordHeaderError
		cv  *tls.CertificateVerificationError
		al  tls.AlertError
		ua  x509.UnknownAuthorityError
		hn  x509.HostnameError
		ci  x509.CertificateInvalidError
		ech *tls.ECHRejectionError
	)
	return errors.As(e, &rh) || errors.As(e, &cv) || errors.As(e, &al) || errors.As(e, &ua) ||
		errors.As(e, &hn) || errors.As(e, &ci) || errors.As(e, &ech)
}

// redisReply matches a Redis error reply (go-redis's Error) whose text satisfies match.
func redisReply(match func(string) bool) func(error) bool {
	return func(e error) bool {
		var re goredis.Error
		return errors.As(e, &re) && match(errorText(re))
	}
}

func prefix(word string) func(string) bool {
	return func(msg string) bool { return msg == word || strings.HasPrefix(msg, word+" ") }
}

func isAuthReply(msg string) bool {
	for _, p := range []string{"NOAUTH", "WRONGPASS"} {
		if prefix(p)(msg) {
			return true
		}
	}
	for _, p := range []string{"ERR invalid password", "ERR AUTH", "ERR Client sent AUTH", "ERR invalid username-password pair"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func isHostNotFound(e error) bool {
	var de *net.DNSError
	return errors.As(e, &de) && !de.IsTimeout
}

func isClosed(e error) bool {
	for _, t := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.ECONNRESET, syscall.EPIPE, syscall.ECONNABORTED} {
		if errors.Is(e, t) {
			return true
		}
	}
	return false
}

func isTimeout(e error) bool {
	if errors.Is(e, context.DeadlineExceeded) || errors.Is(e, os.ErrDeadlineExceeded) || errors.Is(e, goredis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(e, &ne) && ne.Timeout()
}

// errorText is e.Error(), or "" when that panics (a malformed error value
// must not take the caller down).
func errorText(e error) (msg string) {
	defer func() {
		if recover() != nil {
			msg = ""
		}
	}()
	return e.Error()
}
