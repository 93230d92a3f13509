package zookeeper

import (
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
	return netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second, NotRESP: true})
}

// readConnectRequest reads the client's first packet (length-prefixed).
func readConnectRequest(c net.Conn) error {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:])))
	return err
}

// A tenant can aim a backend at a server of its own. One that answers the
// connect request with a 4-byte length announcing 1 GiB must cost the
// operator an error naming the limit, not a 1 GiB buffer per connection
// (the manager runs in 512Mi and the client reconnects every second).
func TestOversizedReplyIsRefusedWithoutAllocating(t *testing.T) {
	srv := rawserver.Start(t, func(c net.Conn) {
		if readConnectRequest(c) != nil {
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
	if got, want := netguard.Describe(err), srv.Addr+": "+netguard.CategoryReplyTooLarge; got != want {
		t.Errorf("the status shows %q; want %q", got, want)
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
		if readConnectRequest(c) != nil {
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
		_ = client.Close()
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
