package redis

import (
	"slices"
	"testing"
)

// redisKeys builds every name as a slice of one string: the names must be
// exactly the concatenations the scripts expect, in their order.
func TestRedisKeysNamesEveryPartOfEveryKey(t *testing.T) {
	for _, prefix := range []string{"", "lockwarden:", "tenant-a:"} {
		l := &Locker{cfg: Config{Prefix: prefix}}
		keys := []string{"a", "ns/team/billing", "x{y}"}
		var want []string
		for _, k := range keys {
			for _, p := range allParts {
				want = append(want, prefix+"{"+k+"}:"+p)
			}
		}
		got := l.redisKeysCap(keys, 1, allParts...)
		if !slices.Equal(got, want) {
			t.Fatalf("prefix %q: redisKeys = %q, want %q", prefix, got, want)
		}
		if cap(got) < len(want)+1 {
			t.Fatalf("prefix %q: cap %d, want room for one more key", prefix, cap(got))
		}
		if got := l.redisKeys(keys[:1], "lock", "fence"); !slices.Equal(got, []string{prefix + "{a}:lock", prefix + "{a}:fence"}) {
			t.Fatalf("prefix %q: redisKeys(lock, fence) = %q", prefix, got)
		}
		if got := l.channel("a"); got != prefix+"{a}:released" {
			t.Fatalf("channel = %q", got)
		}
	}
}

// The acquisition scripts take ten Redis keys per lock key (queue.lua's
// stride): inspect.lua's eight, then the marks of the queue rules, in this
// order; the renew scripts take the holding and the preemption mark.
func TestScriptKeyParts(t *testing.T) {
	want := []string{"lock", "fence", "queue", "deadlines", "waiters", "slots", "slotfences", "slotmeta", "replaced", "preempted"}
	if !slices.Equal(acquireParts, want) {
		t.Fatalf("acquireParts = %q, want %q", acquireParts, want)
	}
	if !slices.Equal(allParts, want[:8]) {
		t.Fatalf("allParts = %q, want %q", allParts, want[:8])
	}
	if !slices.Equal(renewParts, []string{"lock", "preempted"}) || !slices.Equal(semRenewParts, []string{"slots", "slotfences", "slotmeta", "preempted"}) {
		t.Fatalf("renewParts = %q, semRenewParts = %q", renewParts, semRenewParts)
	}
}
