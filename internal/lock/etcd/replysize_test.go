package etcd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// serveOversizedGRPC speaks just enough HTTP/2 to answer every gRPC call
// with response headers and a message prefix announcing 1 GiB, whose bytes
// never come.
func serveOversizedGRPC(c net.Conn) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	if fr.WriteSettings() != nil {
		return
	}
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}} {
		_ = enc.WriteField(f)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.PingFrame:
			if !f.IsAck() && fr.WritePing(true, f.Data) != nil {
				return
			}
		case *http2.HeadersFrame: // a call: answer at once
			id := f.StreamID
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(), EndHeaders: true}) != nil {
				return
			}
			// Not compressed, 1 GiB long.
			if fr.WriteData(id, false, []byte{0, 0x40, 0, 0, 0}) != nil {
				return
			}
		}
	}
}

// A tenant can aim a backend at a server of its own. One that answers a
// call with a message announcing 1 GiB must get an error naming the limit
// at once, not have the client wait for (and buffer) up to 2 GiB.
func TestOversizedReplyIsRefused(t *testing.T) {
	srv := rawserver.Start(t, serveOversizedGRPC)
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Dialed as the operator dials a tenant's etcd.
	dial := netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second, NotRESP: true})
	l := newTestLocker(t, Config{Endpoints: []string{srv.Addr}, Dial: dial})

	ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
	defer cancel()
	err = l.Ping(ctx)
	t.Logf("Ping = %v", err)
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, lock.ErrReplyTooLarge) {
		t.Fatalf("Ping = %v; want ErrBackendUnavailable caused by ErrReplyTooLarge", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "reply too large") || !strings.Contains(msg, "4 MiB") || !strings.Contains(msg, "1073741824") {
		t.Errorf("Ping = %q; want it to say the reply was too large, its size and the limit (4 MiB)", msg)
	}
	if got := netguard.Describe(err); !strings.HasSuffix(got, ": "+netguard.CategoryReplyTooLarge) {
		t.Errorf("the status shows %q; want the category %s", got, netguard.CategoryReplyTooLarge)
	}
	if srv.Accepted() == 0 {
		t.Fatal("the fake server was never dialed")
	}
}
