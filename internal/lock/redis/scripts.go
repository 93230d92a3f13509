package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

var (
	// leaseLua is the lock key's layout, prepended to the scripts that read
	// or write a mutex lease.
	//go:embed lua/lease.lua
	leaseLua string
	// queueLua is the FIFO queue's shared code, prepended (after leaseLua)
	// to the acquisition scripts.
	//go:embed lua/queue.lua
	queueLua string
	// acquireFastLua is acquire.lua's common call; it runs first.
	//go:embed lua/acquirefast.lua
	acquireFastLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/raise.lua
	raiseLua string
	//go:embed lua/dequeue.lua
	dequeueLua string
	//go:embed lua/inspect.lua
	inspectLua string
	//go:embed lua/semacquire.lua
	semAcquireLua string
	//go:embed lua/semrelease.lua
	semReleaseLua string
	//go:embed lua/semrenew.lua
	semRenewLua string
	//go:embed lua/semraise.lua
	semRaiseLua string

	acquireScript = goredis.NewScript(acquireFastLua + leaseLua + queueLua + acquireLua)
	releaseScript = goredis.NewScript(leaseLua + releaseLua)
	renewScript   = goredis.NewScript(leaseLua + renewLua)
	raiseScript   = goredis.NewScript(leaseLua + raiseLua)
	dequeueScript = goredis.NewScript(dequeueLua)
	inspectScript = goredis.NewScript(leaseLua + inspectLua)

	// Semaphores (lock.Request.Limit > 1).
	semAcquireScript = goredis.NewScript(leaseLua + queueLua + semAcquireLua)
	semReleaseScript = goredis.NewScript(semReleaseLua)
	semRenewScript   = goredis.NewScript(semRenewLua)
	semRaiseScript   = goredis.NewScript(semRaiseLua)
)

// run runs a script with EVALSHA, falling back to EVAL when the node does not
// have it cached (after a restart, for example).
func run(ctx context.Context, s *goredis.Script, c goredis.Scripter, name string, keys []string, args ...any) (any, error) {
	v, err := s.Run(ctx, c, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("%s script: %w", name, err)
	}
	return v, nil
}

// Reply decoding: a reply of an unexpected shape is an error, never a panic.

func asInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected reply %q: not an integer", x)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("unexpected reply %v (%T): want an integer", v, v)
	}
}

func asString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	default:
		return "", fmt.Errorf("unexpected reply %v (%T): want a string", v, v)
	}
}

func asSlice(v any, minLen int) ([]any, error) {
	s, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %v (%T): want an array", v, v)
	}
	if len(s) < minLen {
		return nil, fmt.Errorf("unexpected reply %v: want at least %d elements", s, minLen)
	}
	return s, nil
}

// decoder reads the fields of an array reply, keeping the first error.
type decoder struct {
	s   []any
	err error
}

func (d *decoder) int(i int) int64 {
	if d.err != nil {
		return 0
	}
	n, err := asInt(d.s[i])
	if err != nil {
		d.err = fmt.Errorf("element %d: %w", i, err)
	}
	return n
}

func (d *decoder) str(i int) string {
	if d.err != nil {
		return ""
	}
	s, err := asString(d.s[i])
	if err != nil {
		d.err = fmt.Errorf("element %d: %w", i, err)
	}
	return s
}
