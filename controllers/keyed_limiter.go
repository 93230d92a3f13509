package controllers

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// keyedLimiter is a token bucket per key (a backend, a namespace) whose
// idle buckets are dropped: a key that is gone leaves nothing behind.
type keyedLimiter struct {
	limit     rate.Limit
	burst     int
	mu        sync.Mutex
	buckets   map[string]*rate.Limiter
	lastSweep time.Time
}

// keyedLimiterSweep is how often the buckets of idle keys are dropped.
const keyedLimiterSweep = time.Minute

func newKeyedLimiter(perSecond float64, burst int) *keyedLimiter {
	return &keyedLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[string]*rate.Limiter{}}
}

// allow takes one token of key at now, or says it has none left.
func (k *keyedLimiter) allow(key string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bucket(key, now).AllowN(now, 1)
}

// bucket returns key's bucket, made full when key has none (k.mu held).
func (k *keyedLimiter) bucket(key string, now time.Time) *rate.Limiter {
	k.sweep(now)
	b := k.buckets[key]
	if b == nil {
		b = rate.NewLimiter(k.limit, k.burst)
		k.buckets[key] = b
	}
	return b
}

// sweep drops, at most every keyedLimiterSweep, the buckets that are full
// again: forgetting them changes nothing for their keys (k.mu held).
func (k *keyedLimiter) sweep(now time.Time) {
	if now.Sub(k.lastSweep) < keyedLimiterSweep {
		return
	}
	k.lastSweep = now
	for key, b := range k.buckets {
		if b.TokensAt(now) >= float64(k.burst) {
			delete(k.buckets, key)
		}
	}
}

// size returns how many keys have a bucket.
func (k *keyedLimiter) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.buckets)
}

// reserve takes one token of key at now, or the next one the bucket will
// have, and returns how long until then (0: at once).
func (k *keyedLimiter) reserve(key string, now time.Time) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bucket(key, now).ReserveN(now, 1).DelayFrom(now)
}
