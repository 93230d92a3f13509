package redis

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"syscall"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Defaults of Limits.
const (
	// DefaultMaxBulk is the largest bulk string, verbatim string or blob error accepted (4 MiB).
	DefaultMaxBulk = 4 << 20
	// DefaultMaxElements is the largest aggregate count accepted (1<<20).
	DefaultMaxElements = 1 << 20
	// DefaultMaxLine is the longest simple line accepted, type byte and CRLF included (64 KiB).
	DefaultMaxLine = 64 << 10
	// DefaultMaxDepth is the deepest nesting of aggregates accepted.
	DefaultMaxDepth = 128
)

// Limits bound what a connection wrapped by LimitReplies accepts. A zero
// field takes its default.
type Limits struct {
	// MaxBulk bounds the declared length of a bulk string ($), verbatim
	// string (=) or blob error (!), in bytes. Default DefaultMaxBulk.
	MaxBulk int
	// MaxElements bounds the declared count of an aggregate (* array,
	// % map (pairs), ~ set, > push, | attribute (pairs)). The elements still
	// expected across all open (nested) aggregates are bounded by twice it,
	// so nesting cannot multiply what the client allocates ahead of the
	// data. Default DefaultMaxElements.
	MaxElements int
	// MaxLine bounds a simple line (+ - : _ , ( # and the headers of the
	// other types), type byte and CRLF included. Default DefaultMaxLine.
	MaxLine int
	// MaxDepth bounds the nesting of aggregates (the client parses them
	// recursively). Default DefaultMaxDepth.
	MaxDepth int
	// RESP2 refuses RESP3's types (maps, sets, attributes, pushes, nulls,
	// doubles, big numbers, booleans, verbatim strings, blob errors): for a
	// client that asked for RESP2 (go-redis Protocol 2), a server that sends
	// them is not answering what it was asked.
	RESP2 bool
	// Budget, when set, bounds what the replies in flight on every
	// connection sharing it announce together (lock.ReplyBudget; a bulk
	// header counts its length, an aggregate header elementBytes per
	// element it announces).
	Budget *lock.ReplyBudget
}

// elementBytes is what a client allocates per announced aggregate element
// (an interface value, as go-redis's []interface{}).
const elementBytes = 16

func (l Limits) withDefaults() Limits {
	if l.MaxBulk <= 0 {
		l.MaxBulk = DefaultMaxBulk
	}
	if l.MaxElements <= 0 {
		l.MaxElements = DefaultMaxElements
	}
	l.MaxElements = min(l.MaxElements, math.MaxInt/4)
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultMaxLine
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// Sentinels matched (errors.Is) by *ReplyError.
var (
	// ErrNotRedis: the peer does not speak RESP (for example an SSH or HTTP server).
	ErrNotRedis = errors.New("not a Redis server")
	// ErrReplyTooLarge: a reply declares more than Limits allow.
	ErrReplyTooLarge = errors.New("redis reply too large")
	// ErrUnsupportedReply: a valid RESP3 construct the client cannot read (streamed strings and aggregates).
	ErrUnsupportedReply = errors.New("unsupported redis reply")
)

// ReplyError is a reply stream rejected by LimitReplies. The connection is
// unusable afterwards. It matches one of ErrNotRedis, ErrReplyTooLarge or
// ErrUnsupportedReply. Its text is the validator's own and never contains
// bytes read from the peer.
type ReplyError struct {
	// Reason says what is wrong.
	Reason string
	// Limit names the Limits field that was exceeded ("MaxBulk",
	// "MaxElements", "MaxLine", "MaxDepth"); empty for a protocol violation.
	Limit string
	// Offset is the position in the stream (bytes read on the connection) of
	// the byte that was rejected.
	Offset int64
	kind   error
}

// Error says what was rejected.
func (e *ReplyError) Error() string {
	return fmt.Sprintf("redis reply rejected at byte %d: %s", e.Offset, e.Reason)
}

// Is matches the sentinel of the error's kind.
func (e *ReplyError) Is(target error) bool { return target == e.kind }

// Unwrap returns the sentinel of the error's kind.
func (e *ReplyError) Unwrap() error { return e.kind }

// validator states.
const (
	stType      = iota // expecting the type byte of a value
	stLine             // in a simple line, up to LF
	stLen              // in the length of a header, up to CR
	stLenLF            // after the CR of a header
	stPayload          // in the payload of a bulk value
	stPayloadCR        // expecting the CR after a payload
	stPayloadLF        // expecting the LF after a payload
)

type frame struct {
	remaining int  // elements still expected (map and attribute entries count 2 per pair)
	attr      bool // an attribute: its completion does not complete a value of the parent
}

// validator follows a RESP2/RESP3 reply stream byte by byte, as go-redis
// v9's internal/proto reader parses it, and rejects what that reader would
// misread or over-allocate for.
type validator struct {
	lim     Limits
	off     int64 // bytes accepted so far
	state   int
	typ     byte
	lineLen int  // bytes of the current line (type byte included)
	cr      bool // the last byte of the current line was CR
	num     int64
	digits  int
	neg     bool
	left    int64 // payload bytes still to skip
	stack   []frame
	pending int // sum of stack[i].remaining
	// reserved is what the reply being read holds of lim.Budget.
	reserved atomic.Int64
}

func newValidator(l Limits) *validator { return &validator{lim: l.withDefaults()} }

// atBoundary reports whether the stream seen so far ends between two complete replies.
func (v *validator) atBoundary() bool { return v.state == stType && len(v.stack) == 0 }

func (v *validator) fail(at int, kind error, limit, reason string) (int, error) {
	return at, &ReplyError{Reason: reason, Limit: limit, Offset: v.off + int64(at), kind: kind}
}

func (v *validator) notRedis(at int, reason string) (int, error) {
	return v.fail(at, ErrNotRedis, "", "not a Redis server: "+reason)
}

// feed validates the next bytes of the stream. It returns how many bytes of p
// were accepted: all of them, or those before the byte that was rejected,
// together with the *ReplyError.
func (v *validator) feed(p []byte) (int, error) {
	n, err := v.scan(p)
	v.off += int64(n)
	return n, err
}

func (v *validator) scan(p []byte) (int, error) {
	i := 0
	for i < len(p) {
		switch v.state {
		case stType:
			v.typ, v.lineLen, v.cr = p[i], 1, false
			if v.lim.RESP2 {
				switch v.typ {
				case '_', ',', '(', '#', '=', '!', '%', '~', '>', '|':
					return v.fail(i, ErrUnsupportedReply, "", "a RESP3 reply on a connection that asked for RESP2")
				}
			}
			switch v.typ {
			case '+', '-', ':', '_', ',', '(', '#':
				v.state = stLine
			case '$', '=', '!', '*', '%', '~', '>', '|':
				v.state, v.num, v.digits, v.neg = stLen, 0, 0, false
			case ';', '.':
				return v.fail(i, ErrUnsupportedReply, "", "streamed replies (RESP3 chunks) are not supported")
			default:
				return v.notRedis(i, "a reply does not start with a RESP type byte")
			}
			i++

		case stLine:
			rest := p[i:]
			j := bytes.IndexByte(rest, '\n')
			seg := rest
			if j >= 0 {
				seg = rest[:j+1]
			}
			if v.lineLen+len(seg) > v.lim.MaxLine {
				return v.fail(i+max(0, v.lim.MaxLine-v.lineLen), ErrReplyTooLarge, "MaxLine",
					fmt.Sprintf("a line is longer than MaxLine (%d bytes)", v.lim.MaxLine))
			}
			v.lineLen += len(seg)
			if j < 0 {
				v.cr = rest[len(rest)-1] == '\r'
				i = len(p)
				continue
			}
			if (j == 0 && !v.cr) || (j > 0 && rest[j-1] != '\r') {
				return v.notRedis(i+j, "a line does not end with CRLF")
			}
			i += j + 1
			v.state = stType
			v.valueDone()

		case stLen:
			b := p[i]
			v.lineLen++
			if v.lineLen > v.lim.MaxLine {
				return v.fail(i, ErrReplyTooLarge, "MaxLine", fmt.Sprintf("a reply header is longer than MaxLine (%d bytes)", v.lim.MaxLine))
			}
			switch {
			case b >= '0' && b <= '9':
				v.digits++
				if v.digits > 19 || (v.neg && (v.digits > 1 || b != '1')) {
					return v.notRedis(i, "malformed length in a reply header")
				}
				v.num = v.num*10 + int64(b-'0')
			case b == '-' && v.digits == 0 && !v.neg:
				v.neg = true
			case b == '?' && v.digits == 0 && !v.neg:
				return v.fail(i, ErrUnsupportedReply, "", "streamed replies (RESP3 '?' length) are not supported")
			case b == '\r' && v.digits > 0:
				if err := v.checkLength(); err != nil {
					return v.fail(i, ErrReplyTooLarge, err.limit, err.reason)
				}
				v.state = stLenLF
			default:
				return v.notRedis(i, "malformed length in a reply header")
			}
			i++

		case stLenLF:
			if p[i] != '\n' {
				return v.notRedis(i, "a reply header does not end with CRLF")
			}
			v.lineLen++
			if v.lineLen > v.lim.MaxLine {
				return v.fail(i, ErrReplyTooLarge, "MaxLine", fmt.Sprintf("a reply header is longer than MaxLine (%d bytes)", v.lim.MaxLine))
			}
			i++
			v.state = stType
			if err := v.headerDone(); err != nil {
				return v.fail(i-1, ErrReplyTooLarge, err.limit, err.reason)
			}

		case stPayload:
			take := int(min(v.left, int64(len(p)-i)))
			i += take
			v.left -= int64(take)
			if v.left == 0 {
				v.state = stPayloadCR
			}

		case stPayloadCR:
			if p[i] != '\r' {
				return v.notRedis(i, "a bulk string is not followed by CRLF")
			}
			i++
			v.state = stPayloadLF

		case stPayloadLF:
			if p[i] != '\n' {
				return v.notRedis(i, "a bulk string is not followed by CRLF")
			}
			i++
			v.state = stType
			v.valueDone()
		}
	}
	return i, nil
}

type limitErr struct{ limit, reason string }

// checkLength checks a complete header length against the limits.
func (v *validator) checkLength() *limitErr {
	if v.neg {
		return nil
	}
	switch v.typ {
	case '$', '=', '!':
		if v.num > int64(v.lim.MaxBulk) {
			return &limitErr{"MaxBulk", fmt.Sprintf("a bulk reply of %d bytes exceeds MaxBulk (%d)", v.num, v.lim.MaxBulk)}
		}
	default:
		if v.num > int64(v.lim.MaxElements) {
			return &limitErr{"MaxElements", fmt.Sprintf("an aggregate of %d elements exceeds MaxElements (%d)", v.num, v.lim.MaxElements)}
		}
	}
	return nil
}

// headerDone acts on a complete header: a null, a bulk payload to skip, or an aggregate to open.
func (v *validator) headerDone() *limitErr {
	if !v.neg && v.lim.Budget != nil {
		n := v.num
		switch v.typ {
		case '$', '=', '!':
		case '%', '|':
			n *= 2 * elementBytes
		default:
			n *= elementBytes
		}
		if !v.lim.Budget.Reserve(n) {
			return &limitErr{"Budget", fmt.Sprintf("a reply header announcing %d bytes exceeds what the replies in flight on every connection may announce together (%d bytes)", n, v.lim.Budget.Max())}
		}
		v.reserved.Add(n)
	}
	if v.neg { // -1: null bulk or aggregate
		if v.typ != '|' {
			v.valueDone()
		}
		return nil
	}
	switch v.typ {
	case '$', '=', '!':
		v.left = v.num
		v.state = stPayload
		if v.left == 0 {
			v.state = stPayloadCR
		}
		return nil
	}
	n := int(v.num)
	if n == 0 {
		if v.typ != '|' {
			v.valueDone()
		}
		return nil
	}
	slots := n
	if v.typ == '%' || v.typ == '|' {
		slots = 2 * n
	}
	if len(v.stack) >= v.lim.MaxDepth {
		return &limitErr{"MaxDepth", fmt.Sprintf("aggregates are nested deeper than MaxDepth (%d)", v.lim.MaxDepth)}
	}
	if v.pending+slots > 2*v.lim.MaxElements {
		return &limitErr{"MaxElements", fmt.Sprintf("nested aggregates announce more than %d elements not yet received (twice MaxElements)", 2*v.lim.MaxElements)}
	}
	v.stack = append(v.stack, frame{remaining: slots, attr: v.typ == '|'})
	v.pending += slots
	return nil
}

// valueDone records a complete value: it completes one element of the
// innermost open aggregate, and that aggregate, once full, completes one
// element of its parent, and so on. An attribute is not a value: its
// completion does not count in its parent. A complete reply returns its
// reservation of the budget.
func (v *validator) valueDone() {
	defer func() {
		if len(v.stack) == 0 {
			v.releaseAll()
		}
	}()
	for len(v.stack) > 0 {
		top := &v.stack[len(v.stack)-1]
		top.remaining--
		v.pending--
		if top.remaining > 0 {
			return
		}
		attr := top.attr
		v.stack = v.stack[:len(v.stack)-1]
		if attr {
			return
		}
	}
}

// releaseAll returns the current reply's reservation of the budget.
func (v *validator) releaseAll() {
	if n := v.reserved.Swap(0); n != 0 {
		v.lim.Budget.Release(n)
	}
}

// LimitReplies wraps a connection to a Redis server so that everything read
// from it is checked, as it streams through, to be well-formed RESP2/RESP3
// within limits (zero fields take their defaults). Bytes pass through
// unchanged. A read that meets a violation returns the bytes before it, and
// then a *ReplyError, which every later Read and Write returns too.
//
// When conn implements syscall.Conn (a TCP connection), so does the result,
// so that go-redis's pool health check can still peek at the socket.
func LimitReplies(conn net.Conn, limits Limits) net.Conn {
	c := &limitedConn{Conn: conn, v: newValidator(limits)}
	if sc, ok := conn.(syscall.Conn); ok {
		return &limitedSyscallConn{limitedConn: c, sc: sc}
	}
	return c
}

type limitedConn struct {
	net.Conn
	v      *validator // used by the single reader only
	failed atomic.Pointer[ReplyError]
}

// Read reads from the connection and validates what it read.
func (c *limitedConn) Read(p []byte) (int, error) {
	if e := c.failed.Load(); e != nil {
		return 0, e
	}
	n, err := c.Conn.Read(p)
	if n <= 0 {
		return n, err
	}
	ok, verr := c.v.feed(p[:n])
	if verr == nil {
		return n, err
	}
	var re *ReplyError
	errors.As(verr, &re)
	c.failed.Store(re)
	c.v.releaseAll()
	if ok > 0 {
		return ok, nil
	}
	return 0, re
}

// Close closes the connection and returns what its reply in flight held of
// the budget.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.v.releaseAll()
	return err
}

// Write writes unless the reply stream was rejected.
func (c *limitedConn) Write(p []byte) (int, error) {
	if e := c.failed.Load(); e != nil {
		return 0, e
	}
	return c.Conn.Write(p)
}

type limitedSyscallConn struct {
	*limitedConn
	sc syscall.Conn
}

// SyscallConn exposes the socket for non-consuming checks (go-redis peeks
// with MSG_PEEK to tell whether a pooled connection is still alive).
func (c *limitedSyscallConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }
