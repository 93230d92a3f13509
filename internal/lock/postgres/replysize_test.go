package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// A tenant can aim a backend at a server of its own. One that answers the
// startup message with a 5-byte header announcing a 1 GiB message must cost
// the operator an error naming the limit, not a 1 GiB buffer per connection
// (the manager runs in 512Mi, and pings every backend every few seconds).
func TestOversizedReplyIsRefusedWithoutAllocating(t *testing.T) {
	// Just under the 1 GiB pgx accepts by default (the server's own limit).
	const declared = 1<<30 - 2
	srv := rawserver.Start(t, rawserver.PostgresAnnouncing(declared))
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Dialed as the operator dials a tenant's PostgreSQL.
	dial := netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second})
	l := newTestLocker(t, Config{Host: srv.Host, Port: srv.Port, Database: "locks", User: "lockwarden", Dial: dial})

	before := rawserver.HeapSys()
	for i := range 3 { // as the health check repeats
		ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
		err := l.Ping(ctx)
		cancel()
		if i == 0 {
			t.Logf("Ping = %v", err)
		}
		if !errors.Is(err, lock.ErrBackendUnavailable) || !errors.Is(err, lock.ErrReplyTooLarge) {
			t.Errorf("Ping %d = %v; want ErrBackendUnavailable caused by ErrReplyTooLarge", i, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "reply too large") || !strings.Contains(msg, "4 MiB") || !strings.Contains(msg, srv.Addr) {
			t.Errorf("Ping %d = %q; want it to say the reply was too large, the limit (4 MiB) and the endpoint %s", i, msg, srv.Addr)
		}
		// What a status shows for it (backend.Describe: the endpoint and
		// ReplyTooLarge) is checked in package backend.
		var ne *lock.NodeError
		if !errors.As(err, &ne) || ne.Node != srv.Addr {
			t.Errorf("Ping %d = %v; want it to name the node %s", i, err, srv.Addr)
		}
	}
	if srv.Accepted() == 0 {
		t.Fatal("the fake server was never dialed")
	}
	// HeapSys can shrink (the runtime returns memory): only growth counts.
	after := rawserver.HeapSys()
	t.Logf("HeapSys: %d MiB before, %d MiB after", before>>20, after>>20)
	if after > before && after-before > 64<<20 {
		t.Errorf("the heap grew by %d MiB over 3 pings of a server that announced 1 GiB; want no reply-sized allocation", (after-before)>>20)
	}
}
