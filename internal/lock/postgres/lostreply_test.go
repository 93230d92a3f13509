package postgres

import (
	"net"
	"strconv"
	"testing"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestLostReplyLeavesLaterLeaseAlone: an acquisition whose commit reply was
// lost does not free the same owner's later acquisition by another process
// (locktest.RunLostReply). Before, the call released the owner's keys
// whatever their token.
func TestLostReplyLeavesLaterLeaseAlone(t *testing.T) {
	s := pgtest.Start(t)
	locktest.RunLostReply(t, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), func(t *testing.T, addr string) lock.Locker {
		cfg := configFor(s)
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = host
		if cfg.Port, err = strconv.Atoi(port); err != nil {
			t.Fatal(err)
		}
		return newTestLocker(t, cfg, WithOperationTimeout(locktest.LostReplyTimeout))
	})
}
