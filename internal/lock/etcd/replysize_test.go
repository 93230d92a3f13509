package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// pingTenantServer pings srv with a Locker that dials as the operator dials
// a tenant's etcd.
func pingTenantServer(t *testing.T, srv *rawserver.Server) error {
	t.Helper()
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second})
	l := newTestLocker(t, Config{Endpoints: []string{srv.Addr}, Dial: dial})
	ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
	defer cancel()
	return l.Ping(ctx)
}

// A tenant can aim a backend at a server of its own. One that answers a
// call with a message announcing 1 GiB must get an error naming the limit
// at once, not have the client wait for (and buffer) up to 2 GiB.
func TestOversizedReplyIsRefused(t *testing.T) {
	srv := rawserver.Start(t, rawserver.GRPC(0, 0, rawserver.GRPCAnnouncing1GiB, nil))
	err := pingTenantServer(t, srv)
	t.Logf("Ping = %v", err)
	if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, lock.ErrReplyTooLarge) {
		t.Fatalf("Ping = %v; want ErrBackendUnavailable caused by ErrReplyTooLarge", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "reply too large") || !strings.Contains(msg, "4 MiB") || !strings.Contains(msg, "1073741824") {
		t.Errorf("Ping = %q; want it to say the reply was too large, its size and the limit (4 MiB)", msg)
	}
	// What a status shows for it (backend.Describe: the endpoint and
	// ReplyTooLarge) is checked in package backend.
	var ne *lock.NodeError
	if !errors.As(err, &ne) || ne.Node != srv.Addr {
		t.Errorf("Ping = %v; want it to name the node %s", err, srv.Addr)
	}
	if srv.Accepted() == 0 {
		t.Fatal("the fake server was never dialed")
	}
}

// Response headers are bounded too: gRPC's default accepts 16 MiB of them
// per response, buffered as they arrive. The client must tell the server
// its bound (a real server then never sends more) and refuse a server that
// ignores it: one that answers every call with one 8 MiB header, or with
// 1 MiB of small ones, must fail the call, not have it wait for data.
func TestOversizedHeadersAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pad, n int
	}{
		{"one header of 8 MiB", 8 << 20, 1},
		{"4096 headers of 256 bytes", 256, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			advertised := make(chan uint32, 16)
			srv := rawserver.Start(t, rawserver.GRPC(tc.pad, tc.n, nil, advertised))
			err := pingTenantServer(t, srv)
			t.Logf("Ping = %v", err)
			if err == nil {
				t.Fatal("Ping succeeded against headers over the bound")
			}
			select {
			case got := <-advertised:
				if got != MaxHeaderListBytes {
					t.Errorf("the client advertised a header list size of %d bytes; want %d", got, MaxHeaderListBytes)
				}
			default:
				t.Errorf("the client advertised no header list size; want %d bytes", MaxHeaderListBytes)
			}
		})
	}
}

// Status and Describe name the header bound when gRPC reports it.
func TestHeaderListErrorsAreReplyTooLarge(t *testing.T) {
	for _, err := range []error{
		status.Error(codes.Internal, "peer header list size exceeded limit"),
		status.Error(codes.Unavailable, "error reading from server: connection error: COMPRESSION_ERROR"),
	} {
		got := replyTooLarge(err)
		if got == nil || !strings.Contains(got.Error(), "response headers exceed the limit of 16 KiB") {
			t.Errorf("replyTooLarge(%v) = %v; want the 16 KiB header limit named", err, got)
		}
	}
	if got := replyTooLarge(status.Error(codes.Unavailable, "connection refused")); got != nil {
		t.Errorf("replyTooLarge(connection refused) = %v; want nil", got)
	}
}
