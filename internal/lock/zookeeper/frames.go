package zookeeper

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The wire: every packet is a 4-byte big-endian length and a body. The first
// packet each way is the connect request or response; later requests start
// with an xid and an opcode, later replies with replyHeaderLen bytes (xid,
// zxid, error code).
const (
	replyHeaderLen = 16
	statLen        = 68 // a Stat: 6 int64 and 5 int32
	peekLen        = replyHeaderLen + 4
	// minACLLen is the shortest ACL entry: perms and two empty strings.
	minACLLen = 12

	// Requests whose replies the client decodes with an allocation sized by
	// the reply's first field (go-zookeeper's opcodes).
	opGetData      = 4
	opGetACL       = 6
	opGetChildren  = 8
	opGetChildren2 = 12
	opReconfig     = 16
)

// wireInt32 reads a big-endian signed int32, as go-zookeeper does.
func wireInt32(b []byte) int32 {
	return int32(binary.BigEndian.Uint32(b)) //nolint:gosec // G115: the wire's two's complement int32
}

// replyBudget is shared by every ZooKeeper connection of the process.
var replyBudget = lock.NewReplyBudget(ReplyBudgetBytes)

// frameConn checks what a ZooKeeper server sends before the client reads
// it. The client allocates what a reply declares before it reads the bytes
// behind it: the announced length of every packet, the connect response
// included, and inside a packet a []byte from its declared length (the
// connect response's password, a node's data) and a list from its declared
// count (children, ACL entries), recovering the out-of-range read only
// after the memory is taken. zk.WithMaxBufferSize bounds the packets of an
// established session, not the connect response (the client allocates up
// to 4 GiB for it, with no read deadline while it waits for the bytes).
//
// So frameConn follows the requests the client writes (xid to opcode) and,
// in every packet it reads, checks the length against limit and the
// process-wide replyBudget, and the first field of every reply the client
// will decode with a sized allocation against the bytes left in its packet
// and MaxReplyElements; a reply to a request the client did not send is
// refused too. The read of the connect response is bounded by a deadline.
//
// Bytes pass through unchanged. A read that meets a refused length returns
// the bytes before it (the client decodes a packet only when it has all of
// it), then a *lock.ReplyTooLargeError, which every later Read returns too.
type frameConn struct {
	net.Conn
	limit    int64
	rejected func(*lock.ReplyTooLargeError) // called once, on the reader's goroutine
	accepted func()                         // a packet of the established session passed

	// The reader's state (the client has one reader per connection).
	hdr     [4]byte
	nhdr    int
	left    int64 // bytes of the current packet still to come
	size    int64 // the current packet's length
	peek    [peekLen]byte
	npeek   int
	op      int32 // the opcode the current reply answers; -1 when nothing is decoded by size
	packets int64
	failed  atomic.Pointer[lock.ReplyTooLargeError]

	// What the connection holds of replyBudget: for the packet being read,
	// and for those read, which the client decodes before it reads again.
	bmu       sync.Mutex
	cur, done int64
	closed    bool

	// The writer's state.
	wmu    sync.Mutex
	whdr   [4]byte
	nwhdr  int
	wleft  int64
	wpeek  [8]byte
	nwpeek int
	wsent  int64

	mu        sync.Mutex
	ops       map[int32]int32 // xid -> opcode of the requests written and not yet answered
	handshake time.Time       // read deadline until the connect response is in; zero after
	asked     time.Time       // the read deadline the client last set
}

// newFrameConn wraps c; the connect response must be in before handshakeBy.
func newFrameConn(c net.Conn, limit int64, handshakeBy time.Time, rejected func(*lock.ReplyTooLargeError), accepted func()) (*frameConn, error) {
	f := &frameConn{Conn: c, limit: limit, rejected: rejected, accepted: accepted, handshake: handshakeBy, ops: map[int32]int32{}}
	if err := c.SetReadDeadline(handshakeBy); err != nil {
		return nil, err
	}
	return f, nil
}

// Write notes the xid and opcode of every request in p, then writes it.
func (f *frameConn) Write(p []byte) (int, error) {
	f.wmu.Lock()
	f.noteRequests(p)
	f.wmu.Unlock()
	return f.Conn.Write(p)
}

func (f *frameConn) noteRequests(b []byte) {
	for i := 0; i < len(b); {
		if f.wleft > 0 {
			take := min(f.wleft, int64(len(b)-i))
			if f.wsent > 0 && f.nwpeek < len(f.wpeek) {
				c := copy(f.wpeek[f.nwpeek:], b[i:i+int(take)])
				f.nwpeek += c
				if f.nwpeek == len(f.wpeek) {
					xid, op := wireInt32(f.wpeek[:4]), wireInt32(f.wpeek[4:])
					if xid >= 0 {
						f.mu.Lock()
						f.ops[xid] = op
						f.mu.Unlock()
					}
				}
			}
			i += int(take)
			f.wleft -= take
			if f.wleft == 0 {
				f.wsent++
			}
			continue
		}
		f.whdr[f.nwhdr] = b[i]
		f.nwhdr++
		i++
		if f.nwhdr == len(f.whdr) {
			f.nwhdr, f.nwpeek = 0, 0
			f.wleft = int64(binary.BigEndian.Uint32(f.whdr[:]))
			if f.wleft == 0 {
				f.wsent++
			}
		}
	}
}

// Read reads and checks every packet that starts in what was read.
func (f *frameConn) Read(p []byte) (int, error) {
	if e := f.failed.Load(); e != nil {
		return 0, e
	}
	f.bmu.Lock()
	replyBudget.Release(f.done)
	f.done = 0
	f.bmu.Unlock()
	n, err := f.Conn.Read(p)
	if n <= 0 {
		return n, err
	}
	ok, tooLarge := f.scan(p[:n])
	if tooLarge == nil {
		return n, err
	}
	f.failed.Store(tooLarge)
	f.rejected(tooLarge)
	if ok > 0 {
		return ok, nil
	}
	return 0, tooLarge
}

// Close closes the connection and gives back what it holds of replyBudget.
func (f *frameConn) Close() error {
	err := f.Conn.Close()
	f.bmu.Lock()
	defer f.bmu.Unlock()
	f.closed = true
	replyBudget.Release(f.cur + f.done)
	f.cur, f.done = 0, 0
	return err
}

// scan follows the packets in b; it returns how many bytes of b come before
// a refused length or field (all of them if none), and the error for it.
func (f *frameConn) scan(b []byte) (int, *lock.ReplyTooLargeError) {
	i := 0
	for i < len(b) {
		if f.left > 0 {
			take := min(f.left, int64(len(b)-i))
			if f.npeek < peekLen {
				take = min(take, int64(peekLen-f.npeek))
				before := f.npeek
				f.npeek += copy(f.peek[f.npeek:], b[i:i+int(take)])
				if e := f.peeked(before); e != nil {
					return i, e
				}
			}
			i += int(take)
			f.left -= take
			if f.left == 0 {
				f.packetDone()
			}
			continue
		}
		f.hdr[f.nhdr] = b[i]
		f.nhdr++
		if f.nhdr < len(f.hdr) {
			i++
			continue
		}
		f.nhdr = 0
		n := int64(binary.BigEndian.Uint32(f.hdr[:])) // as the client reads it
		if n > f.limit {
			return i, &lock.ReplyTooLargeError{Store: "zookeeper", Declared: n, Limit: f.limit}
		}
		if e := f.reserve(n); e != nil {
			return i, e
		}
		i++
		f.left, f.size, f.npeek, f.op = n, n, 0, -1
		if n == 0 {
			f.packetDone()
		}
	}
	return i, nil
}

// reserve takes n bytes of replyBudget until the client has decoded the packet.
func (f *frameConn) reserve(n int64) *lock.ReplyTooLargeError {
	if n <= 0 {
		return nil
	}
	f.bmu.Lock()
	defer f.bmu.Unlock()
	if f.closed {
		return nil
	}
	if !replyBudget.Reserve(n) {
		return &lock.ReplyTooLargeError{Store: "zookeeper", Declared: n, Limit: ReplyBudgetBytes, Detail: fmt.Sprintf(
			"a packet that would cost %d bytes to read, while the replies being read on every ZooKeeper connection of the operator already hold %d of their %d MiB", n, replyBudget.InUse(), ReplyBudgetBytes>>20)}
	}
	f.cur += n
	return nil
}

// peeked checks the reply header and first field once their bytes are in
// (the peek grew from before bytes).
func (f *frameConn) peeked(before int) *lock.ReplyTooLargeError {
	if f.packets > 0 && before < replyHeaderLen && f.npeek >= replyHeaderLen {
		if e := f.header(); e != nil {
			return e
		}
	}
	if f.npeek < peekLen {
		return nil
	}
	field := int64(binary.BigEndian.Uint32(f.peek[replyHeaderLen:]))
	rest := f.size - peekLen // the bytes after the field
	if f.packets == 0 {
		return f.sized("the connect response's password", int64(wireInt32(f.peek[replyHeaderLen:])), rest, 1, 0)
	}
	switch f.op {
	case opGetData, opReconfig:
		return f.sized("a node's data", int64(wireInt32(f.peek[replyHeaderLen:])), rest-statLen, 1, 0)
	case opGetChildren:
		return f.sized("a list of children", field, rest, 4, MaxReplyElements)
	case opGetChildren2:
		return f.sized("a list of children", field, rest-statLen, 4, MaxReplyElements)
	case opGetACL:
		return f.sized("an ACL", field, rest-statLen, minACLLen, MaxReplyElements)
	}
	return nil
}

// header looks up the request the reply answers.
func (f *frameConn) header() *lock.ReplyTooLargeError {
	xid := wireInt32(f.peek[:4])
	if xid < 0 { // a watch event, a ping: nothing sized by a field
		return nil
	}
	f.mu.Lock()
	op, ok := f.ops[xid]
	delete(f.ops, xid)
	f.mu.Unlock()
	if !ok {
		return &lock.ReplyTooLargeError{Store: "zookeeper", Detail: fmt.Sprintf("a reply to request %d, which the client did not send on this connection", xid)}
	}
	if binary.BigEndian.Uint32(f.peek[12:replyHeaderLen]) == 0 { // the client decodes only a reply without an error
		f.op = op
	}
	return nil
}

// sized checks a declared length (elemSize 1) or count against the bytes
// left in the packet for it and against maxCount (0: none), and takes what
// the client will allocate for it from replyBudget.
func (f *frameConn) sized(what string, declared, room, elemSize, maxCount int64) *lock.ReplyTooLargeError {
	if declared <= 0 { // the client reads a negative length as nil
		return nil
	}
	fit := max(room, 0) / elemSize
	if maxCount > 0 {
		fit = min(fit, maxCount)
	}
	if declared > fit {
		unit := "bytes"
		if elemSize > 1 {
			unit = "entries"
		}
		limit := fmt.Sprintf("the %d that fit in the rest of its %d-byte packet", max(room, 0)/elemSize, f.size)
		if maxCount > 0 && maxCount < max(room, 0)/elemSize {
			limit = fmt.Sprintf("the limit of %d", maxCount)
		}
		return &lock.ReplyTooLargeError{Store: "zookeeper", Declared: declared, Limit: fit, Detail: fmt.Sprintf("%s declared as %d %s, more than %s", what, declared, unit, limit)}
	}
	cost := declared
	if elemSize > 1 {
		cost = declared * 48 // the client's string and ACL values
	}
	return f.reserve(cost)
}

// packetDone ends the handshake deadline after the first packet (the
// connect response), and reports every later one.
func (f *frameConn) packetDone() {
	f.bmu.Lock()
	f.done += f.cur
	f.cur = 0
	f.bmu.Unlock()
	f.packets++
	if f.packets > 1 {
		f.accepted()
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handshake = time.Time{}
	_ = f.Conn.SetReadDeadline(f.asked)
}

// SetReadDeadline sets the read deadline the client asks for, but never
// later than the handshake's while the connect response is not in.
func (f *frameConn) SetReadDeadline(t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = t
	if !f.handshake.IsZero() && (t.IsZero() || t.After(f.handshake)) {
		t = f.handshake
	}
	return f.Conn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines, the read one as SetReadDeadline does.
func (f *frameConn) SetDeadline(t time.Time) error {
	if err := f.SetWriteDeadline(t); err != nil {
		return err
	}
	return f.SetReadDeadline(t)
}
