package bench

import (
	"context"
	"testing"
	"time"

	"github.com/bsm/redislock"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// casDelete is the compare-and-delete every Redis lock releases with.
var casDelete = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// BenchmarkUncontended measures one acquire+release cycle on a free key, one
// goroutine, every library on the same redis-server:
//
//	lib=raw          the physical floor: a go-redis client sending SET key token NX PX
//	                 and EVALSHA of a compare-and-delete, nothing around them
//	lib=lockwarden   Locker.TryAcquire + Locker.Release (standalone)
//	lib=lockwarden-acquire
//	                 Locker.Acquire (blocking; on a free key its first try succeeds,
//	                 without subscribing to releases) + Release
//	lib=redsync      Mutex.TryLockContext + UnlockContext, one pool
//	lib=redislock    Client.Obtain (no retry) + Lock.Release
func BenchmarkUncontended(b *testing.B) {
	s := redistest.Start(b)
	libs := []locklib{
		newLockwarden(b, "lockwarden", []*redistest.Server{s}, false),
		newRedsync(b, "redsync", []*redistest.Server{s}),
		newRedislock(b, "redislock", s, nil),
	}
	b.Run("lib=raw", func(b *testing.B) { benchRaw(b, s.Client(), "uncontended:raw") })
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) { benchCycle(b, l.try, "uncontended:"+l.name) })
	}
	b.Run("lib=lockwarden-acquire", func(b *testing.B) {
		benchCycle(b, libs[0].wait, "uncontended:lockwarden-acquire")
	})
}

// BenchmarkUncontendedPaired runs the same cycles as BenchmarkUncontended, but
// each iteration times one raw-floor cycle and one cycle of the library back
// to back (alternating which goes first), so that both see the same machine
// load. It reports the medians of both and their ratio (x/p50-vs-raw: 1.15
// means 15% slower than the floor), which is robust against other work on
// the machine where ns/op of separate runs is not. ns/op covers both cycles.
func BenchmarkUncontendedPaired(b *testing.B) {
	s := redistest.Start(b)
	c := s.Client()
	libs := []locklib{
		newLockwarden(b, "lockwarden", []*redistest.Server{s}, false),
		newRedsync(b, "redsync", []*redistest.Server{s}),
		newRedislock(b, "redislock", s, nil),
	}
	for _, l := range libs {
		b.Run("lib="+l.name, func(b *testing.B) {
			raw, lib := pairedMedians(b, rawCycle(b, c, "paired:raw:"+l.name), libCycle(b, l.try, "paired:"+l.name))
			b.ReportMetric(float64(raw.Nanoseconds()), "ns/p50-raw-cycle")
			b.ReportMetric(float64(lib.Nanoseconds()), "ns/p50-lib-cycle")
			b.ReportMetric(float64(lib)/float64(raw), "x/p50-vs-raw")
		})
	}
}

// BenchmarkUncontendedHeadToHead is the direct form of "not slower than the
// other libraries": each iteration times one lockwarden cycle and one cycle
// of the other library back to back (alternating which goes first), on the
// same redis-server. It reports both medians and their ratio
// (x/p50-lockwarden-vs-lib: 1.04 means lockwarden's cycle is 4% slower),
// where BenchmarkUncontendedPaired sets each library against the floor in
// a run of its own.
func BenchmarkUncontendedHeadToHead(b *testing.B) {
	s := redistest.Start(b)
	lw := newLockwarden(b, "lockwarden", []*redistest.Server{s}, false)
	others := []locklib{
		newRedsync(b, "redsync", []*redistest.Server{s}),
		newRedislock(b, "redislock", s, nil),
	}
	for _, o := range others {
		b.Run("lib="+o.name, func(b *testing.B) {
			mine, theirs := pairedMedians(b, libCycle(b, lw.try, "h2h:lockwarden:"+o.name), libCycle(b, o.try, "h2h:"+o.name))
			b.ReportMetric(float64(mine.Nanoseconds()), "ns/p50-lockwarden-cycle")
			b.ReportMetric(float64(theirs.Nanoseconds()), "ns/p50-lib-cycle")
			b.ReportMetric(float64(mine)/float64(theirs), "x/p50-lockwarden-vs-lib")
		})
	}
}

// pairedMedians runs a and b back to back in every iteration, alternating
// which goes first, so that both see the same machine load, and returns the
// median duration of each. Each runs once before the clock starts (to
// connect and load the scripts).
func pairedMedians(b *testing.B, first, second func()) (time.Duration, time.Duration) {
	first()
	second()
	firstT := make([]time.Duration, 0, 1024)
	secondT := make([]time.Duration, 0, 1024)
	timed := func(f func(), into *[]time.Duration) {
		start := time.Now()
		f()
		*into = append(*into, time.Since(start))
	}
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			timed(first, &firstT)
			timed(second, &secondT)
		} else {
			timed(second, &secondT)
			timed(first, &firstT)
		}
		i++
	}
	return percentile(firstT, 0.5), percentile(secondT, 0.5)
}

// benchRaw is the floor: two commands, two round trips, a fixed token.
func benchRaw(b *testing.B, c *goredis.Client, key string) {
	cycle := rawCycle(b, c, key)
	cycle() // connect before the clock starts
	for b.Loop() {
		cycle()
	}
}

// rawCycle returns the floor's cycle: SET NX PX, then EVALSHA compare-and-delete.
func rawCycle(b *testing.B, c *goredis.Client, key string) func() {
	ctx := context.Background()
	const token = "0123456789abcdef0123456789abcdef"
	ttl := leaseTTL.Milliseconds()
	if err := casDelete.Load(ctx, c).Err(); err != nil {
		b.Fatalf("SCRIPT LOAD: %v", err)
	}
	cycle := func() {
		set := goredis.NewStatusCmd(ctx, "set", key, token, "px", ttl, "nx")
		if err := c.Process(ctx, set); err != nil || set.Val() != "OK" {
			b.Fatalf("SET NX PX: %q, %v", set.Val(), err)
		}
		n, err := casDelete.EvalSha(ctx, c, []string{key}, token).Int64()
		if err != nil || n != 1 {
			b.Fatalf("EVALSHA compare-and-delete: %d, %v", n, err)
		}
	}
	return cycle
}

// benchCycle runs acquire+release cycles on one key.
func benchCycle(b *testing.B, acquire func(context.Context, string) (releaseFunc, error), key string) {
	cycle := libCycle(b, acquire, key)
	cycle() // connect and load the scripts before the clock starts
	for b.Loop() {
		cycle()
	}
}

// libCycle returns one acquire+release cycle of a library.
func libCycle(b *testing.B, acquire func(context.Context, string) (releaseFunc, error), key string) func() {
	ctx := context.Background()
	cycle := func() {
		release, err := acquire(ctx, key)
		if err != nil {
			b.Fatalf("acquire %s: %v", key, err)
		}
		if err := release(ctx); err != nil {
			b.Fatalf("release %s: %v", key, err)
		}
	}
	return cycle
}

// Retry strategies used for redislock's blocking Obtain in the handover
// benchmarks (redislock's default is not to retry at all).
var (
	// redislockLinear is the setting of redislock's own example: every 100ms.
	redislockLinear = func() redislock.RetryStrategy { return redislock.LinearBackoff(100 * time.Millisecond) }
	// redislockExp starts at the 16ms minimum redislock's documentation
	// recommends and doubles up to 300ms (as in its tests).
	redislockExp = func() redislock.RetryStrategy {
		return redislock.ExponentialBackoff(16*time.Millisecond, 300*time.Millisecond)
	}
)
