package controllers

import (
	"testing"
	"time"
)

// One key's empty bucket holds back only that key; a bucket refills at its
// rate, and the buckets of idle keys are dropped once they are full again.
func TestKeyedLimiterHoldsBackOnlyTheKeyOverItsShare(t *testing.T) {
	const perSecond, burst = 20, 200
	k := newKeyedLimiter(perSecond, burst)
	t0 := time.Unix(1_800_000_000, 0)
	for i := range burst {
		if !k.allow("busy", t0) {
			t.Fatalf("write %d of namespace busy refused within its burst of %d", i+1, burst)
		}
	}
	if k.allow("busy", t0) {
		t.Fatalf("namespace busy was allowed write %d at once; its burst is %d", burst+1, burst)
	}
	if !k.allow("quiet", t0) {
		t.Fatal("namespace quiet was refused while only busy had used its share")
	}
	if !k.allow("busy", t0.Add(time.Second/perSecond)) {
		t.Fatalf("namespace busy refused %v later, when its bucket had a token again", time.Second/perSecond)
	}
	later := t0.Add(keyedLimiterSweep + burst*time.Second/perSecond)
	k.allow("new", later)
	if n := k.size(); n != 1 {
		t.Fatalf("the limiter keeps %d buckets after the others were idle; want only the one just used", n)
	}
}
