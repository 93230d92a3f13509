package redis

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// A tenant can aim a lock at a Redis server of its own. A few bytes of reply
// headers make go-redis allocate what they announce before the data comes:
// a RESP3 map of 1<<20 pairs and a 4 MiB bulk, about 25 bytes, cost some
// 70 MiB per connection when the operator's clients spoke RESP3 within
// LimitReplies' general limits (16 such connections passed the chart's 512Mi).
// Now the clients speak RESP2 with limits sized to what the engine reads:
// every payload below must cost well under 8 MiB of allocation per
// connection, and each Ping must fail.
func TestAnnouncedRepliesCostLittle(t *testing.T) {
	for _, tc := range []struct{ name, payload string }{
		{"resp3-map-and-bulk", rawserver.RedisMapAndBulk},
		{"resp2-array-at-the-old-limit", rawserver.RedisLongArray},
		{"resp2-within-the-limits", rawserver.RedisArrayOfBulks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := rawserver.Start(t, rawserver.Repeat(tc.payload))
			l := newTestLocker(t, Config{Addrs: []string{srv.Addr}})
			const pings = 5
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := range pings {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				err := l.Ping(ctx)
				cancel()
				if err == nil {
					t.Fatalf("Ping %d through a server that sends %q succeeded", i, tc.payload)
				}
				if i == 0 {
					t.Logf("Ping = %v", err)
				}
			}
			runtime.ReadMemStats(&after)
			perConn := (after.TotalAlloc - before.TotalAlloc) / uint64(max(srv.Accepted(), 1))
			t.Logf("%d Pings, %d connections: %d KiB allocated per connection; budget in use after: %d bytes",
				pings, srv.Accepted(), perConn>>10, replyBudget.InUse())
			if perConn > 8<<20 {
				t.Errorf("a connection to a server sending %q cost %d MiB of allocation; want well under 8 MiB", tc.payload, perConn>>20)
			}
		})
	}
	// Every connection closed: the budget is back.
	if err := waitBudgetFree(); err != nil {
		t.Error(err)
	}
}

// waitBudgetFree waits until the Redis replies in flight hold none of the
// process's budget (the tests' connections have closed).
func waitBudgetFree() error {
	deadline := time.Now().Add(10 * time.Second)
	for replyBudget.InUse() != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the reply budget still holds %d bytes after every connection closed", replyBudget.InUse())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
