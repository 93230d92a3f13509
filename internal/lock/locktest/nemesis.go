package locktest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// A Nemesis is one kind of fault a store's fault test injects: Inject breaks
// something and returns once it is healed. Every store's fault test builds
// its list from the same few kinds (KillRestart, PauseResume, a Link's
// Partition, BlackHole and Latency) plus the store's own failovers, and
// passes it as Faults.Nemeses; the tally counts the faults per name for the
// nemesis table of docs/safety.md.
type Nemesis struct {
	// Name names the fault in logs and in the tally, for example
	// "kill-restart" or "partition".
	Name string
	// Inject injects the fault once, with choices (which server, how long)
	// drawn from rng, and returns once it is healed or ctx ended.
	Inject func(ctx context.Context, rng *rand.Rand)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// between returns a duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// KillRestart is the nemesis that kills a server with SIGKILL (kill), waits
// a moment and restarts it with its data (restart): choose picks the server.
func KillRestart(t *testing.T, choose func(rng *rand.Rand) (kill func(), restart func() error)) Nemesis {
	return Nemesis{Name: "kill-restart", Inject: func(ctx context.Context, rng *rand.Rand) {
		kill, restart := choose(rng)
		kill()
		sleep(ctx, between(rng, 20*time.Millisecond, 120*time.Millisecond))
		if err := restart(); err != nil {
			t.Errorf("kill-restart: restart: %v", err)
		}
	}}
}

// PauseResume is the nemesis that stops a server with SIGSTOP for up to
// longest (past the clients' TTL when longest is longer) and resumes it.
func PauseResume(t *testing.T, longest time.Duration, choose func(rng *rand.Rand) (pause, resume func() error)) Nemesis {
	return Nemesis{Name: "pause", Inject: func(ctx context.Context, rng *rand.Rand) {
		pause, resume := choose(rng)
		if err := pause(); err != nil {
			t.Errorf("pause: %v", err)
			return
		}
		sleep(ctx, between(rng, longest/6, longest))
		if err := resume(); err != nil {
			t.Errorf("pause: resume: %v", err)
		}
	}}
}

// Link is a TCP proxy between the clients and one store server, run in the
// test's process by toxiproxy: the clients dial Addr, and the nemeses of the
// link cut, drop or slow what passes.
type Link struct {
	t     *testing.T
	proxy *toxiproxy.Proxy
	mu    sync.Mutex // one fault at a time on a link
}

// NewLink starts a proxy to upstream (host:port) on a free loopback port;
// it stops when the test ends.
func NewLink(t *testing.T, upstream string) *Link {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "link-"+upstream, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start a proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Link{t: t, proxy: p}
}

// NewLinks starts one Link per upstream.
func NewLinks(t *testing.T, upstreams []string) []*Link {
	links := make([]*Link, len(upstreams))
	for i, u := range upstreams {
		links[i] = NewLink(t, u)
	}
	return links
}

// Addrs returns the addresses the clients dial, one per link.
func Addrs(links []*Link) []string {
	addrs := make([]string, len(links))
	for i, l := range links {
		addrs[i] = l.Addr()
	}
	return addrs
}

// Addr is the host:port the clients dial instead of the server's.
func (l *Link) Addr() string {
	l.proxy.Lock()
	defer l.proxy.Unlock()
	return l.proxy.Listen
}

// Cut cuts the link until the returned heal is called (once; later calls
// do nothing, as for every heal of a Link): open connections
// are reset and new ones refused, as when a network partition separates
// the clients from the server (and the kernels notice). Heal listens again
// on the same address.
func (l *Link) Cut() (heal func()) {
	l.mu.Lock()
	l.proxy.Stop()
	var once sync.Once
	return func() {
		once.Do(func() {
			defer l.mu.Unlock()
			if err := l.proxy.Start(); err != nil {
				l.t.Errorf("partition: heal the link to %s: %v", l.proxy.Upstream, err)
			}
		})
	}
}

// Drop drops every byte both ways until the returned heal is called, while
// connections stay open, as when packets are lost without a reset: calls
// hang until the clients' own timeouts end them. New connections are
// accepted and hang too.
func (l *Link) Drop() (heal func()) {
	return l.withToxics("blackhole", `{"type":"timeout","attributes":{"timeout":0}}`, "upstream", "downstream")
}

// DropReplies drops every byte from the server to the clients until the
// returned heal is called, while what the clients send still arrives: the
// server runs each command and its reply is lost, as when the path back
// fails. Calls hang until the clients' own timeouts end them.
func (l *Link) DropReplies() (heal func()) {
	return l.withToxics("lost-replies", `{"type":"timeout","attributes":{"timeout":0}}`, "downstream")
}

// Slow adds latency (± jitter) to every byte both ways until the returned
// heal is called.
func (l *Link) Slow(latency, jitter time.Duration) (heal func()) {
	return l.withToxics("latency", fmt.Sprintf(`{"type":"latency","attributes":{"latency":%d,"jitter":%d}}`, latency.Milliseconds(), jitter.Milliseconds()), "upstream", "downstream")
}

// withToxics adds the toxic described by toxic (toxiproxy's JSON form) to
// the given streams ("upstream": to the server, "downstream": to the
// clients); heal removes them.
func (l *Link) withToxics(name, toxic string, streams ...string) (heal func()) {
	l.mu.Lock()
	var added []string
	for _, stream := range streams {
		n := name + "-" + stream
		body := strings.Replace(toxic, "{", fmt.Sprintf(`{"name":%q,"stream":%q,`, n, stream), 1)
		if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			l.t.Errorf("%s: add the toxic to the link to %s: %v", name, l.proxy.Upstream, err)
			continue
		}
		added = append(added, n)
	}
	var once sync.Once
	return func() { once.Do(func() { l.removeToxics(name, added) }) }
}

// removeToxics removes the toxics added (withToxics) and ends the fault.
func (l *Link) removeToxics(name string, added []string) {
	defer l.mu.Unlock()
	for _, n := range added {
		if err := l.proxy.Toxics.RemoveToxic(context.Background(), n); err != nil {
			l.t.Errorf("%s: remove the toxic from the link to %s: %v", name, l.proxy.Upstream, err)
		}
	}
}

// during breaks a link with brk, waits d (or until ctx ends) and heals it.
func during(ctx context.Context, d time.Duration, brk func() (heal func())) {
	heal := brk()
	defer heal()
	sleep(ctx, d)
}

// LinkNemeses returns the network nemeses over links: partition, black
// hole and latency, each on one link chosen at random for up to longest
// (latency: 20-100ms each way, for up to longest).
func LinkNemeses(links []*Link, longest time.Duration) []Nemesis {
	pick := func(rng *rand.Rand) *Link { return links[rng.IntN(len(links))] }
	return []Nemesis{
		{Name: "partition", Inject: func(ctx context.Context, rng *rand.Rand) {
			during(ctx, between(rng, longest/6, longest), pick(rng).Cut)
		}},
		{Name: "black-hole", Inject: func(ctx context.Context, rng *rand.Rand) {
			during(ctx, between(rng, longest/6, longest), pick(rng).Drop)
		}},
		{Name: "latency", Inject: func(ctx context.Context, rng *rand.Rand) {
			l, latency := pick(rng), between(rng, 20*time.Millisecond, 100*time.Millisecond)
			during(ctx, between(rng, longest/6, longest), func() func() { return l.Slow(latency, 10*time.Millisecond) })
		}},
	}
}
