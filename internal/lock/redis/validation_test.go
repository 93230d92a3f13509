package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// rejection is what a test expects of a rejected call: which sentinel it
// matches and which field it names.
type rejection struct {
	Sentinel string
	Field    string
}

func rejectionOf(err error) rejection {
	var ce *lock.ConfigError
	var ie *lock.InvalidRequestError
	switch {
	case errors.As(err, &ce) && errors.Is(err, lock.ErrInvalidConfig):
		return rejection{Sentinel: "lock.ErrInvalidConfig", Field: ce.Field}
	case errors.As(err, &ie) && errors.Is(err, lock.ErrInvalidRequest):
		return rejection{Sentinel: "ErrInvalidRequest", Field: ie.Field}
	case err == nil:
		return rejection{Sentinel: "none"}
	default:
		return rejection{Sentinel: "other: " + err.Error()}
	}
}

func TestConfigValidation(t *testing.T) {
	a := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003", "127.0.0.1:7004", "127.0.0.1:7005", "127.0.0.1:7006", "127.0.0.1:7007", "127.0.0.1:7008", "127.0.0.1:7009"}
	cases := map[string]struct {
		cfg  Config
		opts []Option
		want rejection
		mode Mode
	}{
		"standalone":               {cfg: Config{Addrs: a[:1]}, want: rejection{Sentinel: "none"}, mode: ModeStandalone},
		"redlock 3":                {cfg: Config{Addrs: a[:3]}, want: rejection{Sentinel: "none"}, mode: ModeRedlock},
		"redlock 7":                {cfg: Config{Addrs: a[:7]}, want: rejection{Sentinel: "none"}, mode: ModeRedlock},
		"sentinel with 2":          {cfg: Config{Addrs: a[:2], MasterName: "m", SentinelPassword: "x"}, want: rejection{Sentinel: "none"}, mode: ModeSentinel},
		"no addresses":             {cfg: Config{}, want: rejection{"lock.ErrInvalidConfig", "Addrs"}},
		"two masters":              {cfg: Config{Addrs: a[:2]}, want: rejection{"lock.ErrInvalidConfig", "Addrs"}},
		"four masters":             {cfg: Config{Addrs: a[:4]}, want: rejection{"lock.ErrInvalidConfig", "Addrs"}},
		"six masters":              {cfg: Config{Addrs: a[:6]}, want: rejection{"lock.ErrInvalidConfig", "Addrs"}},
		"nine masters":             {cfg: Config{Addrs: a[:9]}, want: rejection{"lock.ErrInvalidConfig", "Addrs"}},
		"empty address":            {cfg: Config{Addrs: []string{"127.0.0.1:1", "", "127.0.0.1:2"}}, want: rejection{"lock.ErrInvalidConfig", "Addrs[1]"}},
		"no port":                  {cfg: Config{Addrs: []string{"redis.infra"}}, want: rejection{"lock.ErrInvalidConfig", "Addrs[0]"}},
		"duplicate address":        {cfg: Config{Addrs: []string{a[0], a[1], a[0]}}, want: rejection{"lock.ErrInvalidConfig", "Addrs[2]"}},
		"negative db":              {cfg: Config{Addrs: a[:1], DB: -1}, want: rejection{"lock.ErrInvalidConfig", "DB"}},
		"sentinel password alone":  {cfg: Config{Addrs: a[:1], SentinelPassword: "x"}, want: rejection{"lock.ErrInvalidConfig", "SentinelPassword"}},
		"prefix with a space":      {cfg: Config{Addrs: a[:1], Prefix: "a b"}, want: rejection{"lock.ErrInvalidConfig", "Prefix"}},
		"zero node timeout":        {cfg: Config{Addrs: a[:1]}, opts: []Option{WithNodeTimeout(0)}, want: rejection{"lock.ErrInvalidConfig", "WithNodeTimeout"}},
		"short waiter ttl":         {cfg: Config{Addrs: a[:1]}, opts: []Option{WithWaiterTTL(time.Millisecond)}, want: rejection{"lock.ErrInvalidConfig", "WithWaiterTTL"}},
		"backoff without duration": {cfg: Config{Addrs: a[:1]}, opts: []Option{WithBackoff(wait.Backoff{Factor: 2})}, want: rejection{"lock.ErrInvalidConfig", "WithBackoff"}},
		"nil clock":                {cfg: Config{Addrs: a[:1]}, opts: []Option{WithClock(nil)}, want: rejection{"lock.ErrInvalidConfig", "WithClock"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l, err := New(tc.cfg, tc.opts...)
			if diff := cmp.Diff(tc.want, rejectionOf(err)); diff != "" {
				t.Fatalf("New: rejection mismatch (-want,+got):\n%s", diff)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tc.want.Field) {
					t.Fatalf("error %q does not name the field %s", err, tc.want.Field)
				}
				return
			}
			defer l.Close()
			if l.Mode() != tc.mode {
				t.Fatalf("Mode() = %s, want %s", l.Mode(), tc.mode)
			}
		})
	}
}

// TestBadRequestsSendNothing checks every rejected argument against a plain
// TCP listener that counts connections: a rejected call must not open one.
func TestBadRequestsSendNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_ = c.Close()
		}
	}()
	l := newTestLocker(t, Config{Addrs: []string{ln.Addr().String()}})
	ctx := context.Background()
	many := make([]string, lock.MaxKeys+1)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i)
	}
	lease := &lock.Lease{Keys: []string{"k"}, Owner: "o", TTL: time.Second}
	with := func(f func(*lock.Lease)) *lock.Lease { c := *lease; f(&c); return &c }
	req := lock.Request{Keys: []string{"k"}, TTL: time.Second}
	withReq := func(f func(*lock.Request)) lock.Request { c := req; f(&c); return c }

	cases := map[string]struct {
		call func() error
		want rejection
	}{
		"acquire: no keys": {want: rejection{"ErrInvalidRequest", "keys"},
			call: func() error { _, err := l.TryAcquire(ctx, withReq(func(r *lock.Request) { r.Keys = nil })); return err }},
		"acquire: too many keys": {want: rejection{"ErrInvalidRequest", "keys"},
			call: func() error {
				_, err := l.TryAcquire(ctx, withReq(func(r *lock.Request) { r.Keys = many }))
				return err
			}},
		"acquire: duplicate keys": {want: rejection{"ErrInvalidRequest", "keys[1]"},
			call: func() error {
				_, err := l.TryAcquire(ctx, withReq(func(r *lock.Request) { r.Keys = []string{"a", "a"} }))
				return err
			}},
		"acquire: key with a space": {want: rejection{"ErrInvalidRequest", "keys[0]"},
			call: func() error {
				_, err := l.Acquire(ctx, withReq(func(r *lock.Request) { r.Keys = []string{"a b"} }))
				return err
			}},
		"acquire: ttl under the minimum": {want: rejection{"ErrInvalidRequest", "ttl"},
			call: func() error {
				_, err := l.Acquire(ctx, withReq(func(r *lock.Request) { r.TTL = lock.MinTTL / 2 }))
				return err
			}},
		"try queue: no owner": {want: rejection{"ErrInvalidRequest", "owner"},
			call: func() error {
				_, err := l.TryAcquire(ctx, withReq(func(r *lock.Request) { r.Queue = true }))
				return err
			}},
		"renew: nil lease": {want: rejection{"ErrInvalidRequest", "lease"},
			call: func() error { _, err := l.Renew(ctx, nil, time.Second); return err }},
		"renew: empty owner": {want: rejection{"ErrInvalidRequest", "lease.owner"},
			call: func() error {
				_, err := l.Renew(ctx, with(func(l *lock.Lease) { l.Owner = "" }), time.Second)
				return err
			}},
		"renew: ttl under the minimum": {want: rejection{"ErrInvalidRequest", "ttl"},
			call: func() error { _, err := l.Renew(ctx, lease, time.Millisecond); return err }},
		"renew all: empty owner": {want: rejection{"ErrInvalidRequest", "lease.owner"},
			call: func() error {
				_, errs := l.RenewAll(ctx, []*lock.Lease{with(func(l *lock.Lease) { l.Owner = "" })}, time.Second)
				return errs[0]
			}},
		"release: empty owner": {want: rejection{"ErrInvalidRequest", "lease.owner"},
			call: func() error { return l.Release(ctx, with(func(l *lock.Lease) { l.Owner = "" })) }},
		"release: no keys": {want: rejection{"ErrInvalidRequest", "lease.keys"},
			call: func() error { return l.Release(ctx, with(func(l *lock.Lease) { l.Keys = nil })) }},
		"dequeue: empty owner": {want: rejection{"ErrInvalidRequest", "owner"},
			call: func() error { return l.Dequeue(ctx, []string{"k"}, "") }},
		"inspect: empty key": {want: rejection{"ErrInvalidRequest", "keys[0]"},
			call: func() error { _, err := l.Inspect(ctx, []string{""}); return err }},
		"watch: duplicate keys": {want: rejection{"ErrInvalidRequest", "keys[1]"},
			call: func() error { _, err := l.Watch(ctx, "k", "k"); return err }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, rejectionOf(tc.call())); diff != "" {
				t.Fatalf("rejection mismatch (-want,+got):\n%s", diff)
			}
		})
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("rejected calls opened %d connection(s) to the backend, want none", n)
	}
	// The listener does count: a valid call connects.
	_ = l.Ping(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return conns.Load() > 0, nil
	}); err != nil {
		t.Fatal("a valid Ping never reached the listener: the connection count proves nothing")
	}
}

// TestMalformedReplies feeds the reply decoders shapes a script never
// returns: each must be an error, never a panic.
func TestMalformedReplies(t *testing.T) {
	cases := map[string]any{
		"nil":              nil,
		"string":           "OK",
		"short array":      []any{},
		"inner not array":  []any{"x"},
		"inner too short":  []any{[]any{"", "", "0"}},
		"bad fence":        []any{[]any{"", "", "x", int64(0), "0", []any{}}},
		"odd waiters":      []any{[]any{"", "", "0", int64(0), "0", []any{"w"}}},
		"waiters not list": []any{[]any{"", "", "0", int64(0), "0", "w"}},
	}
	for name, v := range cases {
		if _, err := decodeInspect(v, 1); err == nil {
			t.Errorf("%s: decodeInspect(%#v) succeeded, want an error", name, v)
		}
	}
}
