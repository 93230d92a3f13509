package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// offsetClock is the real clock shifted by a fixed offset: a client whose
// wall clock is wrong.
type offsetClock struct{ d time.Duration }

func (c offsetClock) Now() time.Time                  { return time.Now().Add(c.d) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestFenceWindowMatchesScript: acquire.lua caps proposals at TIME + window
// (queue.lua defines it for both acquisition scripts, acquirefast.lua for
// the free-key path that runs before it),
// and the Go side must know that window; the script's default largest token
// (for the calls that leave ARGV[7] out, defined in acquirefast.lua) is maxToken.
func TestFenceWindowMatchesScript(t *testing.T) {
	want := fmt.Sprintf("local window = %d\n", fenceWindow.Microseconds())
	for name, src := range map[string]string{"queue.lua": queueLua, "acquirefast.lua": acquireFastLua} {
		if !strings.Contains(src, want) {
			t.Fatalf("%s does not contain %q: fenceWindow and the scripts disagree", name, want)
		}
	}
	want = fmt.Sprintf("local maxFence = '%d'\n", maxToken)
	if !strings.Contains(acquireFastLua, want) {
		t.Fatalf("acquirefast.lua does not contain %q: its default largest token and maxToken disagree", want)
	}
	if fenceLead <= 0 || fenceLead >= fenceWindow {
		t.Fatalf("fenceLead %v must be in (0, fenceWindow %v)", fenceLead, fenceWindow)
	}
	// Redlock always proposes (see fenceProposal), within (0, MaxFence).
	if p := fenceProposal(time.Time{}); p != 1 {
		t.Fatalf("proposal for the zero time: %d, want 1", p)
	}
	if p := fenceProposal(time.UnixMicro(lock.MaxFence)); p != lock.MaxFence-1 {
		t.Fatalf("proposal beyond MaxFence: %d, want MaxFence - 1", p)
	}
	now := time.Now()
	if p := fenceProposal(now); p != now.UnixMicro()+fenceLead.Microseconds() {
		t.Fatalf("proposal at %v: %d, want the clock + fenceLead", now, p)
	}
}

// evalCalls sums the EVALSHA and EVAL calls a server has run since its last CONFIG RESETSTAT.
func evalCalls(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	total := 0
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		if err != nil {
			t.Fatalf("cannot parse %q: %v", line, err)
		}
		total += n
	}
	return total
}

// TestRedlockNodesAgreeOnFence: with the client's clock proposing the token,
// the five nodes issue the same token, so an acquire + release cycle is two
// scripts per node, without the fence write-back (raise.lua) round trip.
func TestRedlockNodesAgreeOnFence(t *testing.T) {
	servers := redistest.StartN(t, 5)
	l := newTestLocker(t, Config{Addrs: addrs(servers)})
	ctx := context.Background()
	req := lock.Request{Keys: []string{"agree"}, TTL: time.Minute}
	// The first acquisition of a key finds no counters: the nodes start at
	// their own TIME + window, disagree, and write back once.
	mustCycle := func() int64 {
		lease := acquireSoon(t, l, req)
		if err := l.Release(ctx, lease); err != nil {
			t.Fatalf("release: %v", err)
		}
		return lease.Fence
	}
	last := mustCycle()
	clients := make([]*goredis.Client, len(servers))
	for i, s := range servers {
		clients[i] = s.Client()
		if err := clients[i].ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const cycles = 40
	for i := range cycles {
		f := mustCycle()
		if f <= last {
			t.Fatalf("cycle %d: fence %d after %d", i, f, last)
		}
		last = f
	}
	waitIdle(t, l) // the last cycle's late calls count too
	extra := 0
	for i, cl := range clients {
		c := evalCalls(t, cl)
		if c < 2*cycles {
			t.Fatalf("node %d ran %d scripts in %d cycles, want at least %d", i, c, cycles, 2*cycles)
		}
		extra += c - 2*cycles
	}
	// A cycle whose acquisition ran more than fenceLead after reading the
	// clock (a very loaded machine) may still write back; most must not.
	if extra > cycles {
		t.Fatalf("%d fence write-backs over 5 nodes in %d cycles; want the nodes to agree on most tokens", extra, cycles)
	}
	t.Logf("%d fence write-back scripts over 5 nodes in %d cycles", extra, cycles)
}

// serverMicros reads a server's TIME in microseconds.
func serverMicros(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// TestFenceProposalCapped: a client clock far ahead cannot push a token more
// than the window ahead of the servers' clocks, and one far behind does not
// pull it below them. Standalone sends no proposal: its tokens are the server
// clock or counter + 1, as before.
func TestFenceProposalCapped(t *testing.T) {
	servers := redistest.StartN(t, 3)
	c := servers[0].Client()
	for _, tc := range []struct {
		name   string
		addrs  []string
		offset time.Duration
		window time.Duration // how far above the server clock the token may be
	}{
		{"redlock/ahead", addrs(servers), time.Hour, fenceWindow},
		{"redlock/behind", addrs(servers), -time.Hour, fenceWindow},
		{"redlock/exact", addrs(servers), 0, fenceWindow},
		{"standalone/ahead", addrs(servers[:1]), time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLocker(t, Config{Addrs: tc.addrs}, WithClock(offsetClock{tc.offset}))
			key := "capped-" + strings.ReplaceAll(tc.name, "/", "-")
			var last int64
			for i := range 5 {
				before := serverMicros(t, c)
				lease := acquireSoon(t, l, lock.Request{Keys: []string{key}, TTL: time.Minute})
				after := serverMicros(t, c)
				// All servers run on this machine's clock; allow the first
				// acquisition's counter chain (one per acquisition).
				if lease.Fence <= last || lease.Fence < before || lease.Fence > after+tc.window.Microseconds()+int64(i) {
					t.Fatalf("acquisition %d: fence %d, want above %d and in [%d, %d + %v]", i, lease.Fence, last, before, after, tc.window)
				}
				last = lease.Fence
				if err := l.Release(context.Background(), lease); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFencesWithSkewedClientsAndEmptyRestarts: clients whose clocks are an
// hour ahead, an hour behind, or right take turns while every node is killed
// and restarted empty: the tokens must still only go up. (Taking the client's
// proposal uncapped would fail here: the hour-ahead client's tokens would be
// above what the restarted nodes issue to the others.)
func TestFencesWithSkewedClientsAndEmptyRestarts(t *testing.T) {
	for _, nodes := range []int{1, 5} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			servers := redistest.StartN(t, nodes)
			var lockers []*Locker
			for _, d := range []time.Duration{time.Hour, -time.Hour, 0, fenceWindow / 2, -fenceWindow / 2} {
				lockers = append(lockers, newTestLocker(t, Config{Addrs: addrs(servers)}, WithClock(offsetClock{d})))
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var last int64
			const n = 300
			for i := range n {
				if i%60 == 30 {
					for _, s := range servers {
						s.Kill()
					}
					for _, s := range servers {
						s.Restart()
					}
					for _, l := range lockers {
						waitReachable(t, l)
					}
				}
				l := lockers[rng.IntN(len(lockers))]
				lease := acquireSoon(t, l, lock.Request{Keys: []string{"skew"}, TTL: time.Minute})
				if lease.Fence <= last || lease.Fence >= lock.MaxFence {
					t.Fatalf("acquisition %d: fence %d, want in (%d, MaxFence)", i, lease.Fence, last)
				}
				last = lease.Fence
				if err := l.Release(context.Background(), lease); err != nil && !errors.Is(err, lock.ErrQuorum) {
					t.Fatalf("release %d: %v", i, err)
				}
			}
		})
	}
}

// TestAcquireScriptFence checks acquire.lua's fence rule on one node, with
// explicit proposals: max(counter + 1, TIME, min(proposal, TIME + window)),
// and, with a proposal, TIME + window for a key without a counter. Every
// case runs on both paths of the script: the free-key path
// (acquirefast.lua), and the general path, reached here by queueing the
// owner at the head of the key's queue first.
func TestAcquireScriptFence(t *testing.T) {
	for _, general := range []bool{false, true} {
		t.Run(map[bool]string{false: "free-key path", true: "general path"}[general], func(t *testing.T) {
			testAcquireScriptFence(t, general)
		})
	}
}

func testAcquireScriptFence(t *testing.T, general bool) {
	s := redistest.Start(t)
	c := s.Client()
	l := newTestLocker(t, Config{Addrs: []string{s.Addr}})
	ctx := context.Background()
	w := fenceWindow.Microseconds()
	n := 0
	// prepare returns a fresh key whose counter is counter ("": none) and a
	// request for it, its owner at the head of the key's queue on the
	// general path.
	prepare := func(counter string) (string, lock.Request) {
		t.Helper()
		n++
		key := fmt.Sprintf("script-%d", n)
		if counter != "" {
			if err := c.Set(ctx, "{"+key+"}:fence", counter, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		req, err := lock.PrepareRequest(lock.Request{Keys: []string{key}, TTL: time.Minute}, true)
		if err != nil {
			t.Fatal(err)
		}
		if general {
			queueAtHead(t, c, key, req.Owner)
		}
		return key, req
	}
	acquire := func(counter string, proposal func(now int64) int64) (fence, before, after int64) {
		t.Helper()
		key, req := prepare(counter)
		before = serverMicros(t, c)
		r, err := l.acquireOn(ctx, l.nodes[0], req, 0, proposal(before))
		after = serverMicros(t, c)
		if err != nil || !r.ok {
			t.Fatalf("acquire %s: %+v, %v", key, r, err)
		}
		got, err := c.Get(ctx, "{"+key+"}:fence").Int64()
		if err != nil || got != r.fence {
			t.Fatalf("counter of %s = %d, %v; want the token %d", key, got, err, r.fence)
		}
		if n, err := c.Exists(ctx, "{"+key+"}:queue").Result(); general && (err != nil || n != 0) {
			t.Fatalf("queue of %s after the general path took it: EXISTS %d, %v; want the owner gone from it", key, n, err)
		}
		return r.fence, before, after
	}
	// No proposal (standalone): the server clock, or counter + 1.
	if f, b, a := acquire("", func(int64) int64 { return 0 }); f < b || f > a {
		t.Errorf("no proposal, no counter: fence %d, want TIME in [%d, %d]", f, b, a)
	}
	if f, _, a := acquire("5", func(int64) int64 { return 0 }); f > a {
		t.Errorf("no proposal, counter 5: fence %d, want TIME <= %d", f, a)
	}
	if f, _, _ := acquire("9000000000000000", func(int64) int64 { return 0 }); f != 9000000000000001 {
		t.Errorf("no proposal, counter ahead: fence %d, want counter + 1", f)
	}
	// A proposal within the window is taken as is.
	var p int64
	if f, _, _ := acquire("5", func(now int64) int64 { p = now + w/2; return p }); f != p {
		t.Errorf("proposal within the window: fence %d, want the proposal %d", f, p)
	}
	// Beyond the window it is capped at TIME + window.
	if f, b, a := acquire("5", func(now int64) int64 { return now + 1000*w }); f < b+w || f > a+w {
		t.Errorf("proposal beyond the window: fence %d, want TIME + window in [%d, %d]", f, b+w, a+w)
	}
	// Behind the server clock it does not pull the token below it.
	if f, b, a := acquire("5", func(now int64) int64 { return now - 1000*w }); f < b || f > a {
		t.Errorf("proposal behind: fence %d, want TIME in [%d, %d]", f, b, a)
	}
	// Behind the counter: counter + 1.
	if f, _, _ := acquire("9000000000000000", func(now int64) int64 { return now + w/2 }); f != 9000000000000001 {
		t.Errorf("proposal below the counter: fence %d, want counter + 1", f)
	}
	// No counter (a new key, or a node that restarted empty): TIME + window,
	// above anything this node could have issued before.
	if f, b, a := acquire("", func(now int64) int64 { return now + w/2 }); f < b+w || f > a+w {
		t.Errorf("proposal, no counter: fence %d, want TIME + window in [%d, %d]", f, b+w, a+w)
	}
	if f, b, a := acquire("", func(int64) int64 { return 1 }); f < b+w || f > a+w {
		t.Errorf("proposal 1, no counter: fence %d, want TIME + window in [%d, %d]", f, b+w, a+w)
	}
	// A counter that is not a number counts as none, on both paths.
	if f, b, a := acquire("not a number", func(int64) int64 { return 0 }); f < b || f > a {
		t.Errorf("no proposal, counter not a number: fence %d, want TIME in [%d, %d]", f, b, a)
	}
	if f, b, a := acquire("99999999999999999999 no", func(int64) int64 { return 0 }); f < b || f > a {
		t.Errorf("no proposal, counter not a number (longer than TIME): fence %d, want TIME in [%d, %d]", f, b, a)
	}
	if f, b, a := acquire("not a number", func(now int64) int64 { return now + w/2 }); f < b+w || f > a+w {
		t.Errorf("proposal, counter not a number: fence %d, want TIME + window in [%d, %d]", f, b+w, a+w)
	}
	// A counter at the largest token: the acquisition fails, saying so, and
	// changes nothing (the counter is not lowered, the key is not taken).
	full := strconv.FormatInt(maxToken, 10)
	for _, proposal := range []int64{0, 1} {
		key, req := prepare(full)
		r, err := l.acquireOn(ctx, l.nodes[0], req, 0, proposal)
		if err == nil || !strings.Contains(err.Error(), "would exceed "+full) {
			t.Errorf("proposal %d, counter at the largest token: %+v, %v; want an error saying the token would exceed %s", proposal, r, err, full)
		}
		if got, err := c.Get(ctx, "{"+key+"}:fence").Result(); err != nil || got != full {
			t.Errorf("proposal %d: counter after the refusal = %q, %v; want %s", proposal, got, err, full)
		}
		if n, err := c.Exists(ctx, "{"+key+"}:lock").Result(); err != nil || n != 0 {
			t.Errorf("proposal %d: lock key exists after the refusal (%d, %v)", proposal, n, err)
		}
	}
}

// queueAtHead puts owner alone in key's FIFO queue, alive for a minute, as a
// waiter that joined and kept its heartbeat would be.
func queueAtHead(t *testing.T, c *goredis.Client, key, owner string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute).UnixMilli()
	pipe := c.TxPipeline()
	pipe.ZAdd(ctx, "{"+key+"}:queue", goredis.Z{Score: 1, Member: owner})
	pipe.ZAdd(ctx, "{"+key+"}:deadlines", goredis.Z{Score: float64(deadline), Member: owner})
	pipe.HSet(ctx, "{"+key+"}:waiters", owner, "1700000000000000 waiter")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}
