package zookeeper

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// tenantDial dials as the operator dials a tenant's store.
func tenantDial(t *testing.T) func(ctx context.Context, network, address string) (net.Conn, error) {
	t.Helper()
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second})
}

// A tenant can aim a backend at a server of its own. One that answers the
// connect request with a 4-byte length announcing 1 GiB must cost the
// operator an error naming the limit, not a 1 GiB buffer per connection
// (the manager runs in 512Mi and the client reconnects every second).
func TestOversizedReplyIsRefusedWithoutAllocating(t *testing.T) {
	srv := rawserver.Start(t, func(c net.Conn) {
		if rawserver.ReadZKConnectRequest(c) != nil {
			return
		}
		_, _ = c.Write([]byte{0x40, 0, 0, 0}) // 1 GiB of connect response...
		_, _ = io.Copy(io.Discard, c)         // ...that never comes
	})
	l := newTestLocker(t, Config{Servers: []string{srv.Addr}, Dial: tenantDial(t)})

	before := rawserver.HeapSys()
	ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
	defer cancel()
	err := l.Ping(ctx)
	t.Logf("Ping = %v", err)
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, lock.ErrReplyTooLarge) {
		t.Errorf("Ping = %v; want ErrBackendUnavailable caused by ErrReplyTooLarge", err)
	} else if msg := err.Error(); !strings.Contains(msg, "reply too large") || !strings.Contains(msg, "4 MiB") || !strings.Contains(msg, srv.Addr) {
		t.Errorf("Ping = %q; want it to say the reply was too large, the limit (4 MiB) and the endpoint %s", msg, srv.Addr)
	}
	// What a status shows for it (backend.Describe: the endpoint and
	// ReplyTooLarge) is checked in package backend.
	var ne *lock.NodeError
	if !errors.As(err, &ne) || ne.Node != srv.Addr {
		t.Errorf("Ping = %v; want it to name the node %s", err, srv.Addr)
	}
	after := rawserver.HeapSys()
	t.Logf("HeapSys: %d MiB before, %d MiB after; %d connections", before>>20, after>>20, srv.Accepted())
	if after > before && after-before > 64<<20 {
		t.Errorf("the heap grew by %d MiB while the server announced 1 GiB; want no reply-sized allocation", (after-before)>>20)
	}
}

// A server that answers the connect request with an acceptable length and
// then trickles the body (or sends nothing) must not hold the connection
// forever: the client clears its read deadline before reading the body.
// The handshake is bounded by the session timeout asked for, after which the
// client dials again.
func TestStalledHandshakeIsCut(t *testing.T) {
	closed := make(chan struct{}, 16)
	srv := rawserver.Start(t, func(c net.Conn) {
		if rawserver.ReadZKConnectRequest(c) != nil {
			return
		}
		_, _ = c.Write([]byte{0, 0, 0, 36}) // a connect response's length, then silence
		_, _ = io.Copy(io.Discard, c)       // returns when the client gives up
		closed <- struct{}{}
	})
	// The client connects as soon as the Locker is built.
	newTestLocker(t, Config{Servers: []string{srv.Addr}, SessionTimeout: MinSessionTimeout, Dial: tenantDial(t)})
	select {
	case <-closed:
	case <-time.After(30 * MinSessionTimeout):
		t.Fatalf("the client still holds a connection whose handshake stalled, %v after connecting (session timeout %v)", 30*MinSessionTimeout, MinSessionTimeout)
	}
}

// frameConn follows packets across reads of any size: whole packets pass,
// and a length over the limit, even split over several reads, is refused
// before the reader has all four of its bytes.
func TestFrameConnFollowsPacketsAcrossReads(t *testing.T) {
	packet := func(n int) []byte {
		b := make([]byte, 4+n)
		binary.BigEndian.PutUint32(b, uint32(n))
		if n >= 4 {
			binary.BigEndian.PutUint32(b[4:], 0xffffffff) // xid -1: a watch event
		}
		return b
	}
	var stream []byte
	stream = append(stream, packet(36)...) // the connect response
	stream = append(stream, packet(0)...)
	stream = append(stream, packet(1000)...)
	good := len(stream)
	stream = append(stream, 0x40, 0, 0, 0) // 1 GiB announced
	for _, chunk := range []int{1, 3, 7, 4096} {
		client, server := net.Pipe()
		var rejected *lock.ReplyTooLargeError
		accepted := 0
		f, err := newFrameConn(client, 4<<20, time.Now().Add(time.Minute), func(e *lock.ReplyTooLargeError) { rejected = e }, func() { accepted++ })
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for i := 0; i < len(stream); i += chunk {
				if _, err := server.Write(stream[i:min(i+chunk, len(stream))]); err != nil {
					return
				}
			}
		}()
		got, err := io.ReadAll(f)
		_ = f.Close() // and client
		_ = server.Close()
		if !errors.Is(err, lock.ErrReplyTooLarge) || rejected == nil || rejected.Declared != 1<<30 {
			t.Errorf("reads of %d bytes: error %v, rejected %+v; want the 1 GiB length refused", chunk, err, rejected)
		}
		if len(got) < good || len(got) > good+3 {
			t.Errorf("reads of %d bytes: the reader got %d bytes; want the %d of the good packets and at most 3 of the bad length", chunk, len(got), good)
		}
		if accepted != 2 {
			t.Errorf("reads of %d bytes: %d packets after the connect response reported; want 2", chunk, accepted)
		}
	}
}

var (
	zkPacket    = rawserver.ZKPacket
	replyHeader = rawserver.ZKReplyHeader
)

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// connectResponse is a connect response granting session 1 with a password
// whose declared length is passwdLen and whose bytes are 16 zeros.
func connectResponse(passwdLen uint32) []byte {
	return rawserver.ZKConnectResponse(uint32(testSessionTimeout.Milliseconds()), passwdLen)
}

// scriptConn reads a fixed stream and discards what is written.
type scriptConn struct {
	net.Conn
	r io.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }
func (c *scriptConn) Close() error                     { return nil }

// writeRequest writes a request with xid and opcode through f.
func writeRequest(f *frameConn, xid, op int32) {
	_, _ = f.Write(zkPacket(be32(uint32(xid)), be32(uint32(op)), make([]byte, 9)))
}

// Inside a packet whose length is fine, the client allocates what a field
// declares before it reads the bytes behind it (a []byte from its length, a
// list from its count). frameConn must refuse every such field larger than
// what is left of its packet, or over MaxReplyElements, and let through the
// replies a real server sends, in reads of any size.
func TestFrameConnChecksDeclaredFields(t *testing.T) {
	stat := make([]byte, statLen)
	names := func(n int) []byte {
		var b []byte
		for range n {
			b = append(b, be32(4)...)
			b = append(b, "lock"...)
		}
		return b
	}
	cases := []struct {
		name    string
		op      int32  // the request written before the reply (xid 1); 0: none
		reply   []byte // after a good connect response, or the connect response itself when op < 0
		refused string // in the error; "" when the stream must pass
	}{
		{"connect response with its password", -1, connectResponse(16), ""},
		{"connect response declaring a 1 GiB password", -1, connectResponse(1 << 30), "the connect response's password declared as 1073741824 bytes, more than the 16 that fit in the rest of its 36-byte packet"},
		{"node data", opGetData, zkPacket(replyHeader(1, 0), be32(3), []byte("abc"), stat), ""},
		{"node data declared as 2 GiB", opGetData, zkPacket(replyHeader(1, 0), be32(0x7fffffff), stat), "a node's data declared as 2147483647 bytes, more than the 0 that fit"},
		{"node data of -1 bytes (nil)", opGetData, zkPacket(replyHeader(1, 0), be32(0xffffffff), stat), ""},
		{"children", opGetChildren2, zkPacket(replyHeader(1, 0), be32(3), names(3), stat), ""},
		{"2^32-1 children", opGetChildren2, zkPacket(replyHeader(1, 0), be32(0xffffffff), stat), "a list of children declared as 4294967295 entries, more than the 0 that fit"},
		{"children without a stat", opGetChildren, zkPacket(replyHeader(1, 0), be32(2), names(2)), ""},
		{"more children than the limit", opGetChildren, zkPacket(replyHeader(1, 0), be32(MaxReplyElements+1), make([]byte, 4*(MaxReplyElements+1))), "more than the limit of 65536"},
		{"an ACL of 2^31 entries", opGetACL, zkPacket(replyHeader(1, 0), be32(1<<31), stat), "an ACL declared as 2147483648 entries"},
		{"an error reply is not decoded", opGetChildren2, zkPacket(replyHeader(1, 0xffffff9b), be32(0xffffffff)), ""},
		{"a reply to a request not sent", opGetData, zkPacket(replyHeader(7, 0), be32(0), stat), "a reply to request 7, which the client did not send"},
		{"a watch event", 0, zkPacket(replyHeader(-1, 0), be32(4), be32(3), be32(5), []byte("/lock")), ""},
		{"another request's reply is not read as node data", opSync, zkPacket(replyHeader(1, 0), be32(1), []byte("/")), ""},
	}
	for _, tc := range cases {
		var stream []byte
		if tc.op >= 0 {
			stream = append(connectResponse(16), tc.reply...)
		} else {
			stream = tc.reply
		}
		for _, chunk := range []int{1, 5, 4096} {
			sc := &scriptConn{r: &chunkReader{b: stream, n: chunk}}
			var rejected *lock.ReplyTooLargeError
			f, err := newFrameConn(sc, MaxReplyBytes, time.Now().Add(time.Minute), func(e *lock.ReplyTooLargeError) { rejected = e }, func() {})
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.Write(connectRequestBytes())
			if tc.op > 0 {
				writeRequest(f, 1, tc.op)
			}
			got, err := io.ReadAll(f)
			_ = f.Close()
			switch {
			case tc.refused == "" && (err != nil || !bytes.Equal(got, stream)):
				t.Errorf("%s, reads of %d bytes: read %d of %d bytes, error %v; want the whole stream", tc.name, chunk, len(got), len(stream), err)
			case tc.refused != "" && (!errors.Is(err, lock.ErrReplyTooLarge) || rejected == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("%s, reads of %d bytes: error %v; want ErrReplyTooLarge saying %q", tc.name, chunk, err, tc.refused)
			case tc.refused != "" && len(got) >= len(stream):
				t.Errorf("%s, reads of %d bytes: the client got the whole refused packet", tc.name, chunk)
			}
		}
	}
	if n := replyBudget.InUse(); n != 0 {
		t.Errorf("after every connection closed, %d bytes of the reply budget are still held; want 0", n)
	}
}

// opSync is go-zookeeper's opcode for Sync, whose reply is a path.
const opSync = 9

func connectRequestBytes() []byte { return zkPacket(make([]byte, 44)) }

// chunkReader returns b in reads of at most n bytes.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// A tenant's server that sends small packets declaring huge fields must
// cost the operator an error naming the field, not the memory declared:
// before frameConn checked fields, one connect response of 36 bytes took
// 1 GiB per connection attempt, and a list of children 2^32 entries.
func TestDeclaredFieldsCostLittle(t *testing.T) {
	stat := make([]byte, statLen)
	cases := []struct {
		name    string
		connect []byte
		reply   func(op int32) []byte
		call    func(ctx context.Context, l *Locker) error
		want    string
	}{
		{"connect response declaring a 1 GiB password", connectResponse(1 << 30), func(int32) []byte { return stat },
			func(ctx context.Context, l *Locker) error { return l.Ping(ctx) }, "the connect response's password declared as 1073741824 bytes"},
		{"2^32-1 children", connectResponse(16), func(op int32) []byte {
			switch op {
			case opSync:
				return append(be32(1), '/')
			case opGetChildren, opGetChildren2:
				return append(be32(0xffffffff), stat...)
			}
			return stat
		}, func(ctx context.Context, l *Locker) error { _, err := l.Inspect(ctx, []string{"nightly"}); return err }, "a list of children declared as 4294967295 entries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := rawserver.Start(t, rawserver.ZooKeeper(tc.connect, tc.reply))
			l := newTestLocker(t, Config{Servers: []string{srv.Addr}, Dial: tenantDial(t)})
			before := rawserver.HeapSys()
			ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
			defer cancel()
			err := tc.call(ctx, l)
			after := rawserver.HeapSys()
			t.Logf("error: %v", err)
			t.Logf("HeapSys: %d MiB before, %d MiB after; %d connections", before>>20, after>>20, srv.Accepted())
			if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, lock.ErrReplyTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want ErrBackendUnavailable caused by ErrReplyTooLarge, saying %q", err, tc.want)
			}
			var ne *lock.NodeError
			if !errors.As(err, &ne) || ne.Node != srv.Addr {
				t.Errorf("error %v; want it to name the node %s", err, srv.Addr)
			}
			if after > before && after-before > 64<<20 {
				t.Errorf("the heap grew by %d MiB; want no allocation of the declared size", (after-before)>>20)
			}
		})
	}
}
