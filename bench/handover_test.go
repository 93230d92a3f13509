package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// holdShort is how long the holder keeps the lock after the waiter started
// waiting in the hold=2ms benchmarks: long enough on loopback for every
// library's first attempt to have failed (the waiter is parked), short enough
// that the handover dominates.
const holdShort = 2 * time.Millisecond

// holdRandomMax bounds the random holds: 2ms plus up to 250ms (uniform), the
// widest retry interval of redsync's defaults, so a polling waiter's phase
// relative to the release is spread over its whole retry interval.
const holdRandomMax = 250 * time.Millisecond

// randomPairs is how many holder/waiter pairs (each on its own key) run at once
// with random holds, to collect enough handovers per second of -benchtime.
const randomPairs = 8

// BenchmarkHandover measures the handover under contention: the time from the
// moment the holder calls Release (its unlock) to the moment a waiter that was
// blocked in the library's own blocking acquire holds the lock. Each operation
// is one handover: the waiter starts waiting, the holder keeps the lock for
// the hold time, releases, and the waiter becomes the next holder.
//
//	lib=lockwarden          Locker.Acquire: pub/sub release message, fallback backoff 10ms..1s
//	lib=lockwarden-queue    Locker.Acquire with Request.Queue (FIFO queue + pub/sub)
//	lib=redsync             Mutex.LockContext with its defaults: 32 tries, random 50-250ms apart
//	lib=redislock-linear    Client.Obtain, RetryStrategy LinearBackoff(100ms) (redislock's example)
//	lib=redislock-exp       Client.Obtain, RetryStrategy ExponentialBackoff(16ms, 300ms)
//
// hold=2ms: one pair, the release comes 2ms after the waiter started (a polling
// waiter then sleeps most of its first retry interval). hold=random: 8 pairs on
// 8 keys, each hold uniform in [2ms, 252ms], so a polling waiter's retry phase
// is spread out as in a long wait. ns/op is wall time per handover (holds
// included; with 8 pairs, divided by 8); ns/p50-handover and ns/p99-handover
// are the percentiles of the handover samples of the run.
func BenchmarkHandover(b *testing.B) {
	s := redistest.Start(b)
	one := []*redistest.Server{s}
	libs := []locklib{
		newLockwarden(b, "lockwarden", one, false),
		newLockwarden(b, "lockwarden-queue", one, true),
		newRedsync(b, "redsync", one),
		newRedislock(b, "redislock-linear", s, redislockLinear),
		newRedislock(b, "redislock-exp", s, redislockExp),
	}
	for _, mode := range []struct {
		name  string
		pairs int
		hold  func() time.Duration
	}{
		{"hold=2ms", 1, func() time.Duration { return holdShort }},
		{"hold=random", randomPairs, func() time.Duration { return holdShort + rand.N(holdRandomMax) }},
	} {
		for _, l := range libs {
			b.Run(fmt.Sprintf("%s/lib=%s", mode.name, l.name), func(b *testing.B) {
				benchHandover(b, l, fmt.Sprintf("handover:%s:%s", mode.name, l.name), mode.pairs, mode.hold)
			})
		}
	}
}

type handoff struct {
	release releaseFunc
	held    time.Time
	err     error
}

func benchHandover(b *testing.B, l locklib, key string, pairs int, hold func() time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		left    atomic.Int64
		mu      sync.Mutex
		samples = make([]time.Duration, 0, b.N)
		wg      sync.WaitGroup
		failure atomic.Pointer[error]
	)
	left.Store(int64(b.N))
	fail := func(err error) {
		failure.CompareAndSwap(nil, &err)
		cancel()
	}
	// Each pair: this goroutine holds and releases; a waiter goroutine waits.
	pair := func(key string) {
		release, err := l.try(ctx, key)
		if err != nil {
			fail(fmt.Errorf("first acquire of %s: %w", key, err))
			return
		}
		start := make(chan struct{})
		got := make(chan handoff)
		go func() {
			for range start {
				wctx, wcancel := context.WithTimeout(ctx, waitTimeout)
				rel, err := l.wait(wctx, key)
				wcancel()
				got <- handoff{release: rel, held: time.Now(), err: err}
			}
		}()
		defer close(start)
		for left.Add(-1) >= 0 && ctx.Err() == nil {
			start <- struct{}{}
			time.Sleep(hold())
			released := time.Now()
			if err := release(ctx); err != nil {
				fail(fmt.Errorf("release %s: %w", key, err))
				<-got
				return
			}
			h := <-got
			if h.err != nil {
				fail(fmt.Errorf("blocking acquire of %s: %w", key, h.err))
				return
			}
			mu.Lock()
			samples = append(samples, h.held.Sub(released))
			mu.Unlock()
			release = h.release
		}
		if err := release(context.Background()); err != nil {
			fail(fmt.Errorf("last release of %s: %w", key, err))
		}
	}
	b.ResetTimer()
	for i := range pairs {
		wg.Go(func() { pair(fmt.Sprintf("%s:%d", key, i)) })
	}
	wg.Wait()
	b.StopTimer()
	if p := failure.Load(); p != nil {
		b.Fatal(*p)
	}
	reportLatency(b, "handover", samples)
}
