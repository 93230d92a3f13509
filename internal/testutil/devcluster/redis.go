package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// startRedis starts the Redis masters in parallel, each on its preferred
// port when that is free, else on a free port.
func (c *Cluster) startRedis(ctx context.Context) error {
	c.Redis = make([]*Redis, len(c.opts.RedisPorts))
	taken := map[int]bool{}
	for i, want := range c.opts.RedisPorts {
		port := 0
		if want > 0 && !taken[want] && portFree(want) {
			port = want
		}
		for port == 0 || taken[port] {
			p, err := freePort()
			if err != nil {
				return err
			}
			port = p
		}
		taken[port] = true
		name := fmt.Sprintf("redis-%d", i)
		r := &Redis{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), LogPath: c.LogPath(name), dir: filepath.Join(c.Dir, name)}
		if err := os.MkdirAll(r.dir, 0o700); err != nil {
			return err
		}
		conf := filepath.Join(r.dir, "redis.conf")
		lines := []string{
			"bind 127.0.0.1",
			"port " + strconv.Itoa(port),
			"protected-mode no",
			"daemonize no",
			"dir " + r.dir,
			`save ""`,
			"appendonly no",
		}
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return err
		}
		r.proc = c.newProcess(name, c.opts.RedisServer, []string{conf})
		c.Redis[i] = r
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.Redis))
	for i := range c.Redis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.StartRedis(ctx, i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// StartRedis starts Redis master i (again, empty: it keeps no data) on its
// port and waits until it answers PING.
func (c *Cluster) StartRedis(ctx context.Context, i int) error {
	r := c.Redis[i]
	if !r.proc.running() {
		if err := r.proc.start(); err != nil {
			return err
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rc.Close()
	return c.waitFor(ctx, r.proc, "redis-server at "+r.Addr, func(ctx context.Context) (bool, error) {
		return rc.Ping(ctx).Err() == nil, nil
	})
}

// KillRedis kills Redis master i with SIGKILL; it loses its data.
func (c *Cluster) KillRedis(i int) { c.Redis[i].proc.kill() }

// RestartRedis kills Redis master i and starts it again, empty, on the same port.
func (c *Cluster) RestartRedis(ctx context.Context, i int) error {
	c.KillRedis(i)
	return c.StartRedis(ctx, i)
}
