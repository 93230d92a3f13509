package redis_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/lock"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// Tests of the network guard as the engine uses it: every client New builds
// dials through netguard.Dialer, its replies bounded by LimitReplies, and
// every failure reads, in a status, as the category backend.Describe gives
// it (these tests are outside package redis so that they can import package
// backend, which imports it). The fake servers need no redis-server, so
// those tests run under -short too.

const sshBanner = "SSH-2.0-OpenSSH_9.6\r\n"

// guardFake is a TCP server on 127.0.0.1 that is not Redis, or only pretends.
type guardFake struct {
	addr     string
	accepted atomic.Int32
}

func startGuardFake(t *testing.T, handle func(net.Conn)) *guardFake {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	f := &guardFake{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return f
}

// bannerFirst writes a banner on connect, as SSH servers do, and reads on.
func bannerFirst(banner string) func(net.Conn) {
	return func(c net.Conn) {
		if _, err := c.Write([]byte(banner)); err == nil {
			_, _ = io.Copy(io.Discard, c)
		}
	}
}

// answerEveryRead writes reply after every read.
func answerEveryRead(reply string) func(net.Conn) {
	return func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	}
}

// httpServer answers the first request bytes with a 400 and closes, as an
// HTTP server does with a request it cannot parse.
func httpServer(c net.Conn) {
	buf := make([]byte, 4096)
	if _, err := c.Read(buf); err != nil {
		return
	}
	_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"))
}

// fakeRedis parses RESP commands and answers each with reply(command).
func fakeRedis(reply func(cmd []string) string) func(net.Conn) {
	return func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			cmd, err := readCommand(r)
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(reply(cmd))); err != nil {
				return
			}
		}
	}
}

func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not a command: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	cmd := make([]string, n)
	for i := range cmd {
		h, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(h, "$")))
		if err != nil || size < 0 || size > 1<<20 {
			return nil, fmt.Errorf("bad bulk header %q", h)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		cmd[i] = string(b[:size])
	}
	return cmd, nil
}

func respArray(items ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(items))
	for _, s := range items {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s)
	}
	return b.String()
}

// pingOnly answers PING and refuses everything else, HELLO included (so the
// client falls back to RESP2 without a handshake).
func pingOnly(cmd []string) string {
	if strings.EqualFold(cmd[0], "PING") {
		return "+PONG\r\n"
	}
	return "-ERR unknown command\r\n"
}

func mustGuardPolicy(t *testing.T, allow, deny []string) *netguard.EndpointPolicy {
	t.Helper()
	p, err := netguard.NewEndpointPolicy(allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func pingFails(t *testing.T, cfg redislock.Config, opts ...redislock.Option) error {
	t.Helper()
	l := redislock.NewTestLocker(t, cfg, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := l.Ping(ctx)
	if err == nil {
		t.Fatalf("Ping %v succeeded, want a failure", cfg.Addrs)
	}
	if !errors.Is(err, lock.ErrBackendUnavailable) && !errors.Is(err, lock.ErrQuorum) {
		t.Fatalf("Ping: %v, want it to match ErrBackendUnavailable or ErrQuorum", err)
	}
	return err
}

// TestGuardNotRedis: an SSH or HTTP server is NotRedis, and nothing it sent
// reaches the description (not even the error's own text).
func TestGuardNotRedis(t *testing.T) {
	peers := map[string]struct {
		handle func(net.Conn)
		bytes  []string
	}{
		"ssh":  {bannerFirst(sshBanner), []string{"SSH", "OpenSSH", "9.6"}},
		"http": {httpServer, []string{"HTTP", "400", "Bad Request", "text/plain"}},
	}
	for name, peer := range peers {
		for _, policy := range []*netguard.EndpointPolicy{nil, mustGuardPolicy(t, []string{"127.0.0.1/32"}, nil)} {
			f := startGuardFake(t, peer.handle)
			err := pingFails(t, redislock.Config{Addrs: []string{f.addr}, EndpointPolicy: policy})
			if c := backend.Category(err); c != backend.CategoryNotRedis {
				t.Fatalf("%s: Category = %s, want %s (err: %v)", name, c, backend.CategoryNotRedis, err)
			}
			if d, want := backend.Describe(err), f.addr+": "+backend.CategoryNotRedis; d != want {
				t.Fatalf("%s: Describe = %q, want %q", name, d, want)
			}
			// The error names the fake's address, whose port may contain
			// "400" or "9.6" by chance: only the rest is checked.
			text := strings.ReplaceAll(err.Error(), f.addr, "<addr>")
			for _, b := range peer.bytes {
				if strings.Contains(text, b) {
					t.Fatalf("%s: the error repeats the peer's bytes (%q): %v", name, b, err)
				}
			}
		}
	}
}

// TestGuardHugeReplies: a peer announcing a 1 GiB string or 2^31 elements
// fails the call before the client allocates for it. The peer refuses HELLO
// as an old Redis does, so that the client goes on to the commands whose
// replies it would allocate for (unguarded, go-redis allocates the announced
// 1 GiB for PING's reply, and 2^31 slots for the script's array).
func TestGuardHugeReplies(t *testing.T) {
	for _, reply := range []string{"$1073741824\r\n", "*2147483647\r\n", "%2147483647\r\n", "=1073741824\r\n", "!1073741824\r\n"} {
		afterHello := fakeRedis(func(cmd []string) string {
			if strings.EqualFold(cmd[0], "HELLO") {
				return "-ERR unknown command 'HELLO'\r\n"
			}
			return reply
		})
		calls := map[string]func(*redislock.Locker) error{
			"Ping": func(l *redislock.Locker) error { return l.Ping(context.Background()) },
			"TryAcquire": func(l *redislock.Locker) error {
				_, err := l.TryAcquire(context.Background(), lock.Request{Keys: []string{"k"}, TTL: time.Second})
				return err
			},
		}
		for name, call := range calls {
			for _, handle := range []func(net.Conn){afterHello, answerEveryRead(reply)} {
				f := startGuardFake(t, handle)
				l := redislock.NewTestLocker(t, redislock.Config{Addrs: []string{f.addr}})
				var err error
				alloc := allocatedDuring(func() { err = call(l) })
				// The clients ask for RESP2: a RESP3 type (map, verbatim
				// string, blob error) is refused at its first byte, as a
				// peer that does not answer in the protocol asked.
				want := backend.CategoryReplyTooLarge
				if strings.ContainsAny(reply[:1], "%=!") {
					want = backend.CategoryNotRedis
				}
				if c := backend.Category(err); c != want {
					t.Fatalf("%s, reply %q: Category = %s, want %s (err: %v)", name, reply, c, want, err)
				}
				if d, wantDesc := backend.Describe(err), f.addr+": "+want; d != wantDesc {
					t.Fatalf("%s, reply %q: Describe = %q, want %q", name, reply, d, wantDesc)
				}
				if alloc > 64<<20 {
					t.Fatalf("%s, reply %q: the failed call allocated %d MiB", name, reply, alloc>>20)
				}
			}
		}
	}
}

func allocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// assertGuardNothingConnected proves that no dial reached the fake so far.
// The count is read after one more connection that the fake does accept:
// connections are accepted in the order they were made.
func assertGuardNothingConnected(t *testing.T, f *guardFake) {
	t.Helper()
	c, err := net.DialTimeout("tcp", f.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The fake answers PING: once the answer is read, the fake's accept loop
	// has counted this connection and every one made before it.
	if _, err := c.Write([]byte(respArray("PING"))); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("the fake did not answer: %q, %v", line, err)
	}
	if n := f.accepted.Load(); n != 1 {
		t.Fatalf("the fake accepted %d connections before the check's own: a denied endpoint was connected to", n-1)
	}
}

// TestGuardDeniesLoopback: with the default policy, loopback endpoints (by
// address, by name, IPv4-mapped; standalone, Redlock, Sentinels) are refused
// before any connection; an allow-list CIDR lets them through.
func TestGuardDeniesLoopback(t *testing.T) {
	f := startGuardFake(t, fakeRedis(pingOnly))
	_, port, _ := net.SplitHostPort(f.addr)
	def := mustGuardPolicy(t, nil, nil)
	configs := []redislock.Config{
		{Addrs: []string{"127.0.0.1:" + port}},
		{Addrs: []string{"localhost:" + port}},
		{Addrs: []string{"[::ffff:127.0.0.1]:" + port}},
		// Three Redlock members must be distinct servers (Config.Validate):
		// the other two ports are never dialled, the policy refuses first.
		{Addrs: []string{"127.0.0.1:" + port, "localhost:1", "[::ffff:127.0.0.1]:2"}},
		{Addrs: []string{"127.0.0.1:" + port}, MasterName: "mymaster"},
	}
	for _, cfg := range configs {
		cfg.EndpointPolicy = def
		err := pingFails(t, cfg)
		if c := backend.Category(err); c != backend.CategoryDeniedByPolicy {
			t.Fatalf("%v: Category = %s, want %s (err: %v)", cfg.Addrs, c, backend.CategoryDeniedByPolicy, err)
		}
		d := backend.Describe(err)
		if !strings.Contains(d, backend.CategoryDeniedByPolicy+" (loopback address") {
			t.Fatalf("%v: Describe = %q, want the loopback denial", cfg.Addrs, d)
		}
	}
	redlockErr := pingFails(t, redislock.Config{Addrs: configs[3].Addrs, EndpointPolicy: def})
	if !errors.Is(redlockErr, lock.ErrQuorum) || strings.Count(backend.Describe(redlockErr), "DeniedByPolicy") != 3 {
		t.Fatalf("Redlock: Describe = %q, want a denial per node", backend.Describe(redlockErr))
	}
	assertGuardNothingConnected(t, f)

	// Explicitly allowed, the same endpoint answers.
	l := redislock.NewTestLocker(t, redislock.Config{Addrs: []string{"127.0.0.1:" + port}, EndpointPolicy: mustGuardPolicy(t, []string{"127.0.0.1/32"}, nil)})
	if err := l.Ping(context.Background()); err != nil {
		t.Fatalf("Ping with 127.0.0.1/32 allowed: %v", err)
	}
}

// TestGuardSentinelNamingMetadata: a Sentinel (allowed) that names the cloud
// metadata address as the master: the master connection goes through the
// same dialer and is refused.
func TestGuardSentinelNamingMetadata(t *testing.T) {
	sentinel := startGuardFake(t, fakeRedis(func(cmd []string) string {
		switch {
		case strings.EqualFold(cmd[0], "SENTINEL") && len(cmd) > 1 && strings.EqualFold(cmd[1], "get-master-addr-by-name"):
			return respArray("169.254.169.254", "6379")
		case strings.EqualFold(cmd[0], "SENTINEL"):
			return "*0\r\n"
		case strings.EqualFold(cmd[0], "SUBSCRIBE"):
			var b strings.Builder
			for i, ch := range cmd[1:] {
				fmt.Fprintf(&b, "*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:%d\r\n", len(ch), ch, i+1)
			}
			return b.String()
		}
		return pingOnly(cmd)
	}))
	cfg := redislock.Config{Addrs: []string{sentinel.addr}, MasterName: "mymaster", EndpointPolicy: mustGuardPolicy(t, []string{"127.0.0.1/32"}, nil)}
	err := pingFails(t, cfg)
	if c := backend.Category(err); c != backend.CategoryDeniedByPolicy {
		t.Fatalf("Category = %s, want %s (err: %v)", c, backend.CategoryDeniedByPolicy, err)
	}
	if d := backend.Describe(err); !strings.Contains(d, "link-local or cloud metadata address: 169.254.169.254") {
		t.Fatalf("Describe = %q, want the metadata denial", d)
	}
	if sentinel.accepted.Load() == 0 {
		t.Fatal("the Sentinel was never asked: the test proves nothing")
	}
}

// TestGuardTLSToNonTLSPeer: with TLS configured, a peer that does not speak
// TLS fails the handshake, and its banner is not shown.
func TestGuardTLSToNonTLSPeer(t *testing.T) {
	f := startGuardFake(t, bannerFirst(sshBanner))
	err := pingFails(t, redislock.Config{Addrs: []string{f.addr}, TLS: &tls.Config{ServerName: "redis", MinVersion: tls.VersionTLS12}})
	if c := backend.Category(err); c != backend.CategoryTLSHandshakeFailed {
		t.Fatalf("Category = %s, want %s (err: %v)", c, backend.CategoryTLSHandshakeFailed, err)
	}
	if d, want := backend.Describe(err), f.addr+": "+backend.CategoryTLSHandshakeFailed; d != want {
		t.Fatalf("Describe = %q, want %q", d, want)
	}
}

// TestGuardTimeoutAndRefused: a peer that never answers is a Timeout; a
// closed port is ConnectionRefused; Redlock names each node.
func TestGuardTimeoutAndRefused(t *testing.T) {
	silent := startGuardFake(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	err := pingFails(t, redislock.Config{Addrs: []string{silent.addr}}, redislock.WithNodeTimeout(300*time.Millisecond))
	if c := backend.Category(err); c != backend.CategoryTimeout {
		t.Fatalf("silent peer: Category = %s, want %s (err: %v)", c, backend.CategoryTimeout, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	ssh := startGuardFake(t, bannerFirst(sshBanner))
	huge := startGuardFake(t, answerEveryRead("$1073741824\r\n"))
	err = pingFails(t, redislock.Config{Addrs: []string{closed, ssh.addr, huge.addr}})
	want := fmt.Sprintf("%s: ConnectionRefused; %s: NotRedis; %s: ReplyTooLarge", closed, ssh.addr, huge.addr)
	if d := backend.Describe(err); d != want {
		t.Fatalf("Redlock: Describe = %q, want %q", d, want)
	}
}

// TestGuardedLockerAgainstRedis: with a policy that allows the servers, the
// guarded dialer carries every operation, in plain TCP, TLS, Redlock and
// Sentinel modes.
func TestGuardedLockerAgainstRedis(t *testing.T) {
	allow := mustGuardPolicy(t, []string{"127.0.0.1/32"}, []string{"10.96.0.1"})
	plain := redistest.Start(t)
	secure := redistest.Start(t, redistest.WithPassword("s3cret"), redistest.WithTLS())
	masters := redistest.StartN(t, 3)
	sentinels := redistest.StartSentinels(t, plain, 1, "guarded")
	configs := map[string]redislock.Config{
		"standalone": {Addrs: []string{plain.Addr}, EndpointPolicy: allow},
		"tls":        {Addrs: []string{secure.Addr}, Password: "s3cret", TLS: redislock.TLSFor(secure), EndpointPolicy: allow},
		"redlock":    {Addrs: redislock.Addrs(masters), EndpointPolicy: allow},
		"sentinel":   {Addrs: sentinels.Addrs(), MasterName: "guarded", EndpointPolicy: allow, Prefix: "sentinel:"},
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			l := redislock.NewTestLocker(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := l.Ping(ctx); err != nil {
				t.Fatalf("Ping: %v", err)
			}
			events, err := l.Watch(ctx, "k")
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 2 * time.Second, Holder: "guard-test"})
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if lease, err = l.Renew(ctx, lease, 3*time.Second); err != nil {
				t.Fatalf("Renew: %v", err)
			}
			states, err := l.Inspect(ctx, []string{"k"})
			if err != nil || len(states) != 1 || !states[0].Held || states[0].Holder != "guard-test" {
				t.Fatalf("Inspect = %+v, %v; want k held by guard-test", states, err)
			}
			if err := l.Release(ctx, lease); err != nil {
				t.Fatalf("Release: %v", err)
			}
			select {
			case k := <-events:
				if k != "k" {
					t.Fatalf("Watch delivered %q, want k", k)
				}
			case <-ctx.Done():
				t.Fatal("the release was never delivered to Watch")
			}
		})
	}
}

// TestGuardCategoriesAgainstRedis: failures of real servers map to their categories.
func TestGuardCategoriesAgainstRedis(t *testing.T) {
	protected := redistest.Start(t, redistest.WithPassword("s3cret"))
	secure := redistest.Start(t, redistest.WithTLS())
	cases := map[string]struct {
		cfg  redislock.Config
		want string
	}{
		"wrong password": {redislock.Config{Addrs: []string{protected.Addr}, Password: "wrong"}, backend.CategoryAuthenticationFailed},
		"no password":    {redislock.Config{Addrs: []string{protected.Addr}}, backend.CategoryAuthenticationFailed},
		"untrusted TLS":  {redislock.Config{Addrs: []string{secure.Addr}, TLS: redislock.TLSFor(protected)}, backend.CategoryTLSHandshakeFailed},
	}
	for name, tc := range cases {
		err := pingFails(t, tc.cfg)
		if c := backend.Category(err); c != tc.want {
			t.Errorf("%s: Category = %s, want %s (err: %v)", name, c, tc.want, err)
		}
		if d, want := backend.Describe(err), tc.cfg.Addrs[0]+": "+tc.want; d != want {
			t.Errorf("%s: Describe = %q, want %q", name, d, want)
		}
	}
}
