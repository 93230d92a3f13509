package redis

import (
	"testing"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestLostReplyLeavesLaterLeaseAlone: an acquisition whose reply was lost
// does not free the same owner's later acquisition by another process
// (locktest.RunLostReply). Before, the attempt released the owner's keys
// whatever their token.
func TestLostReplyLeavesLaterLeaseAlone(t *testing.T) {
	s := redistest.Start(t)
	locktest.RunLostReply(t, s.Addr, func(t *testing.T, addr string) lock.Locker {
		return newTestLocker(t, Config{Addrs: []string{addr}}, WithNodeTimeout(locktest.LostReplyTimeout))
	})
}
