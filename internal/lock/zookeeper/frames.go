package zookeeper

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// frameConn checks what a ZooKeeper server sends before the client reads
// it. Every packet, the connect response included, is a 4-byte big-endian
// length followed by that many bytes; the client allocates the announced
// length before the bytes arrive. zk.WithMaxBufferSize bounds the packets of
// an established session, not the connect response (the client allocates up
// to 4 GiB for it, with no read deadline while it waits for the bytes), so
// frameConn refuses every packet announced over limit before the client sees
// its length, and bounds the read of the connect response by a deadline.
//
// Bytes pass through unchanged. A read that meets an oversized length
// returns the bytes before it, then a *lock.ReplyTooLargeError, which every
// later Read returns too.
type frameConn struct {
	net.Conn
	limit    int64
	rejected func(*lock.ReplyTooLargeError) // called once, on the reader's goroutine
	accepted func()                         // a packet of the established session passed

	// The reader's state (the client has one reader per connection).
	hdr     [4]byte
	nhdr    int
	left    int64 // bytes of the current packet still to come
	packets int64
	failed  atomic.Pointer[lock.ReplyTooLargeError]

	mu        sync.Mutex
	handshake time.Time // read deadline until the connect response is in; zero after
	asked     time.Time // the read deadline the client last set
}

// newFrameConn wraps c; the connect response must be in before handshakeBy.
func newFrameConn(c net.Conn, limit int64, handshakeBy time.Time, rejected func(*lock.ReplyTooLargeError), accepted func()) (*frameConn, error) {
	f := &frameConn{Conn: c, limit: limit, rejected: rejected, accepted: accepted, handshake: handshakeBy}
	if err := c.SetReadDeadline(handshakeBy); err != nil {
		return nil, err
	}
	return f, nil
}

// Read reads and checks the length of every packet that starts in what was read.
func (f *frameConn) Read(p []byte) (int, error) {
	if e := f.failed.Load(); e != nil {
		return 0, e
	}
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

// scan follows the packets in b; it returns how many bytes of b come before
// a length over the limit (all of them if none), and the error for it.
func (f *frameConn) scan(b []byte) (int, *lock.ReplyTooLargeError) {
	i := 0
	for i < len(b) {
		if f.left > 0 {
			take := min(f.left, int64(len(b)-i))
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
		i++
		f.left = n
		if n == 0 {
			f.packetDone()
		}
	}
	return i, nil
}

// packetDone ends the handshake deadline after the first packet (the
// connect response), and reports every later one.
func (f *frameConn) packetDone() {
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
