package redis

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// recorder keeps every byte read on the connections it dials.
type recorder struct {
	mu      sync.Mutex
	streams []*[]byte
}

type teeConn struct {
	net.Conn
	r   *recorder
	buf *[]byte
}

func (c *teeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	*c.buf = append(*c.buf, p[:n]...)
	c.r.mu.Unlock()
	return n, err
}

// dial records the raw stream below LimitReplies, so that what the client
// reads has been validated live, and the recording can be replayed.
func (r *recorder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	buf := new([]byte)
	r.mu.Lock()
	r.streams = append(r.streams, buf)
	r.mu.Unlock()
	return LimitReplies(&teeConn{Conn: c, r: r, buf: buf}, Limits{}), nil
}

func (r *recorder) recorded() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]byte
	for _, s := range r.streams {
		out = append(out, append([]byte(nil), (*s)...))
	}
	return out
}

// TestRealRepliesPassAtEveryReadBoundary runs commands of every reply type
// against a real redis-server through LimitReplies (RESP3 and RESP2, pub/sub
// included), then replays each recorded stream cut at every offset.
func TestRealRepliesPassAtEveryReadBoundary(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rec recorder
	value := strings.Repeat("line\r\n$3\r\n*1\r\n", 200) // a value that looks like RESP

	for _, proto := range []int{3, 2} {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Protocol: proto, Dialer: rec.dial, MaxRetries: -1})
		mustOK := func(what string, err error) {
			t.Helper()
			if err != nil && err != goredis.Nil { //nolint:errorlint // go-redis returns Nil unwrapped
				t.Fatalf("RESP%d %s: %v", proto, what, err)
			}
		}
		mustOK("PING", c.Ping(ctx).Err())
		mustOK("INFO", c.Info(ctx).Err())
		mustOK("SET", c.Set(ctx, "k", value, 0).Err())
		got, err := c.Get(ctx, "k").Result()
		mustOK("GET", err)
		if got != value {
			t.Fatalf("RESP%d: GET returned %d bytes, want the %d set", proto, len(got), len(value))
		}
		mustOK("GET missing", c.Get(ctx, "missing").Err())
		mustOK("HSET", c.HSet(ctx, "h", "a", "1", "b", "2").Err())
		mustOK("HGETALL", c.HGetAll(ctx, "h").Err())
		mustOK("SADD", c.SAdd(ctx, "s", "x", "y").Err())
		mustOK("SMEMBERS", c.SMembers(ctx, "s").Err())
		mustOK("ZADD", c.ZAdd(ctx, "z", goredis.Z{Score: 1.5, Member: "m"}).Err())
		mustOK("ZSCORE", c.ZScore(ctx, "z", "m").Err())
		mustOK("EVAL nested", c.Eval(ctx, `return {1, {"a", {"b", false}}, redis.status_reply("OK"), redis.error_reply("ERR inner")}`, nil).Err())
		mustOK("EVAL RESP3 types", c.Eval(ctx, `redis.setresp(3)
			return {redis.call("HGETALL", "h"), {double=3.5}, {big_number="123456789012345678901234567890"}, {set={a=true}}, {map={k={1,2}}}}`, nil).Err())
		if err := c.Do(ctx, "NO-SUCH-COMMAND").Err(); err == nil {
			t.Fatalf("RESP%d: an unknown command succeeded", proto)
		}
		pipe := c.Pipeline()
		for range 20 {
			pipe.Get(ctx, "k")
			pipe.HGetAll(ctx, "h")
		}
		_, err = pipe.Exec(ctx)
		mustOK("pipeline", err)

		sub := c.Subscribe(ctx, "ch")
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatalf("RESP%d SUBSCRIBE: %v", proto, err)
		}
		mustOK("PUBLISH", c.Publish(ctx, "ch", value).Err())
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil || msg.Payload != value {
			t.Fatalf("RESP%d: message %v, %v", proto, msg, err)
		}
		_ = sub.Close()
		_ = c.Close()
	}

	var all []byte
	for i, stream := range rec.recorded() {
		all = append(all, '\r', '\n')
		all = append(all, stream...)
		if len(stream) == 0 {
			continue
		}
		checkPassesEverySplit(t, "recorded stream "+string(rune('A'+i)), stream)
	}
	// The recordings hold every type the commands were chosen for (the
	// values used contain none of these sequences).
	for _, header := range []string{"\r\n%", "\r\n~", "\r\n>", "\r\n,", "\r\n(", "\r\n_", "\r\n#", "\r\n$-1", "\r\n*", "\r\n-ERR", "\r\n+OK", "\r\n:"} {
		if !strings.Contains(string(all), header) {
			t.Errorf("no reply starting with %q was recorded", header[2:])
		}
	}
}

// TestRealSentinelRepliesPass: what Sentinels answer passes too.
func TestRealSentinelRepliesPass(t *testing.T) {
	master := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, master, 1, "mymaster")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rec recorder
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: sentinels.Addrs()[0], Dialer: rec.dial, MaxRetries: -1})
	defer sc.Close()
	if _, err := sc.GetMasterAddrByName(ctx, "mymaster").Result(); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{sc.Masters(ctx).Err(), sc.Replicas(ctx, "mymaster").Err(), sc.Sentinels(ctx, "mymaster").Err()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, stream := range rec.recorded() {
		checkPassesEverySplit(t, "sentinel stream", stream)
	}
}
