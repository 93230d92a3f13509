package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	redislocker "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// leaseTTL is the TTL every library uses: long enough that no lease expires
// during a benchmark operation, so every release is a real release.
const leaseTTL = 10 * time.Second

// waitTimeout bounds one blocking acquisition in the handover benchmarks.
const waitTimeout = 5 * time.Second

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's own logger (pub/sub connections closing at the
// end of a benchmark would be printed between the results).
func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// releaseFunc releases a held lock.
type releaseFunc func(ctx context.Context) error

// locklib is one library under test, bound to a set of servers. try makes one
// non-blocking attempt; wait blocks until the lock is held (each library's own
// waiting: pub/sub or polling).
type locklib struct {
	name string
	try  func(ctx context.Context, key string) (releaseFunc, error)
	wait func(ctx context.Context, key string) (releaseFunc, error)
}

func addrs(servers []*redistest.Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}

// newLockwarden builds lockwarden's Locker on the servers (1: standalone;
// 3, 5 or 7: Redlock) with the engine's defaults. queue makes wait use
// Request.Queue (FIFO) instead of a plain blocking Acquire.
func newLockwarden(b *testing.B, name string, servers []*redistest.Server, queue bool) locklib {
	b.Helper()
	// The node timeout is a second, like the go-redis read and write
	// timeouts the other libraries rely on: the default 100ms turns one
	// scheduling stall of a loaded machine into a failed benchmark run. An
	// answered call does not wait for it, so it changes no timing.
	l, err := redislocker.New(redislocker.Config{Addrs: addrs(servers), Prefix: "bench:"}, redislocker.WithNodeTimeout(time.Second))
	if err != nil {
		b.Fatalf("redislock.New: %v", err)
	}
	b.Cleanup(func() { _ = l.Close() })
	rel := func(lease *lock.Lease) releaseFunc {
		return func(ctx context.Context) error { return l.Release(ctx, lease) }
	}
	return locklib{
		name: name,
		try: func(ctx context.Context, key string) (releaseFunc, error) {
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: leaseTTL, Holder: "bench"})
			if err != nil {
				return nil, err
			}
			return rel(lease), nil
		},
		wait: func(ctx context.Context, key string) (releaseFunc, error) {
			lease, err := l.Acquire(ctx, lock.Request{Keys: []string{key}, TTL: leaseTTL, Holder: "bench", Queue: queue})
			if err != nil {
				return nil, err
			}
			return rel(lease), nil
		},
	}
}

// newRedsync builds redsync with one pool per server (one pool: a single
// instance; five: Redlock) and its defaults: 32 tries, a random 50-250ms
// delay between them. Only the expiry is set, to leaseTTL.
func newRedsync(b *testing.B, name string, servers []*redistest.Server) locklib {
	b.Helper()
	pools := make([]redsyncredis.Pool, 0, len(servers))
	for _, s := range servers {
		pools = append(pools, redsyncgoredis.NewPool(s.Client()))
	}
	rs := redsync.New(pools...)
	acquire := func(ctx context.Context, key string, tries int) (releaseFunc, error) {
		m := rs.NewMutex(key, redsync.WithExpiry(leaseTTL))
		var err error
		if tries == 1 {
			err = m.TryLockContext(ctx)
		} else {
			err = m.LockContext(ctx)
		}
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = errors.New("redsync: unlock failed")
			}
			return err
		}, nil
	}
	return locklib{
		name: name,
		try:  func(ctx context.Context, key string) (releaseFunc, error) { return acquire(ctx, key, 1) },
		wait: func(ctx context.Context, key string) (releaseFunc, error) { return acquire(ctx, key, 0) },
	}
}

// newRedislock builds bsm/redislock on one server. Its default is not to
// retry; retry makes a fresh retry strategy for each blocking Obtain (the
// exponential one counts its attempts).
func newRedislock(b *testing.B, name string, s *redistest.Server, retry func() redislock.RetryStrategy) locklib {
	b.Helper()
	c := redislock.New(s.Client())
	obtain := func(ctx context.Context, key string, opt *redislock.Options) (releaseFunc, error) {
		l, err := c.Obtain(ctx, key, leaseTTL, opt)
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
	return locklib{
		name: name,
		try:  func(ctx context.Context, key string) (releaseFunc, error) { return obtain(ctx, key, nil) },
		wait: func(ctx context.Context, key string) (releaseFunc, error) {
			if retry == nil {
				return nil, fmt.Errorf("%s: no retry strategy", name)
			}
			return obtain(ctx, key, &redislock.Options{RetryStrategy: retry()})
		},
	}
}

// percentile returns the q-quantile (0 < q <= 1) of samples by the
// nearest-rank method; samples is sorted in place.
func percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	rank := int(q*float64(len(samples)) + 0.999999)
	rank = max(1, min(rank, len(samples)))
	return samples[rank-1]
}

// reportLatency reports the p50 and p99 of samples as ns/p50-<what> and
// ns/p99-<what> (benchstat shows them as sec/…, scaled).
func reportLatency(b *testing.B, what string, samples []time.Duration) {
	b.Helper()
	if len(samples) == 0 {
		return
	}
	b.ReportMetric(float64(percentile(samples, 0.50).Nanoseconds()), "ns/p50-"+what)
	b.ReportMetric(float64(percentile(samples, 0.99).Nanoseconds()), "ns/p99-"+what)
}
