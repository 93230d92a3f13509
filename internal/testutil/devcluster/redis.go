package devcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// startRedis starts the Redis masters in parallel, each on its preferred
// port when that is free, else on a free port; with Options.ExternalRedis it
// starts none and checks that those answer.
func (c *Cluster) startRedis(ctx context.Context) error {
	if len(c.opts.ExternalRedis) > 0 {
		return c.useExternalRedis(ctx)
	}
	c.Redis = make([]*Redis, len(c.opts.RedisPorts))
	for i := range c.Redis {
		c.Redis[i] = &Redis{}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.Redis))
	for i, want := range c.opts.RedisPorts {
		var first []int
		if want > 0 && freeport.Claim(want) {
			if portFree(want) {
				first = []int{want}
			} else {
				freeport.Give(want)
			}
		}
		name := fmt.Sprintf("redis-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.onFreePorts(name, first, 1, func(p []int) error {
				if err := c.configureRedis(i, p[0]); err != nil {
					return err
				}
				return c.StartRedis(ctx, i)
			})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// useExternalRedis records Options.ExternalRedis as the cluster's Redis
// masters (without a process: the cluster does not run them) once each
// answers PING.
func (c *Cluster) useExternalRedis(ctx context.Context) error {
	c.Redis = make([]*Redis, len(c.opts.ExternalRedis))
	for i, addr := range c.opts.ExternalRedis {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("external Redis %q: %w", addr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("external Redis %q: port: %w", addr, err)
		}
		c.Redis[i] = &Redis{Addr: addr, Port: p}
		rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: time.Second, WriteTimeout: time.Second})
		err = c.waitFor(ctx, nil, "external Redis at "+addr, func(ctx context.Context) (bool, error) {
			return rc.Ping(ctx).Err() == nil, nil
		})
		_ = rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// configureRedis writes the configuration of Redis master i for port.
func (c *Cluster) configureRedis(i, port int) error {
	name := fmt.Sprintf("redis-%d", i)
	r := c.Redis[i]
	r.Port, r.Addr, r.LogPath, r.dir = port, "127.0.0.1:"+strconv.Itoa(port), c.LogPath(name), filepath.Join(c.Dir, name)
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
	r.proc = c.newProcess(name, c.opts.RedisServer, []string{conf}, []int{port})
	return nil
}

// StartRedis starts Redis master i (again, empty: it keeps no data) on its
// port and waits until it answers PING as the process just started (INFO's
// process_id). It fails when another process took the port while it was down.
func (c *Cluster) StartRedis(ctx context.Context, i int) error {
	r := c.Redis[i]
	if r.proc == nil {
		return fmt.Errorf("Redis master %d (%s) is not this cluster's to start", i, r.Addr)
	}
	if !r.proc.running() {
		if err := r.proc.start(); err != nil {
			return err
		}
	}
	pid := r.proc.pid()
	rc := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer rc.Close()
	return c.waitFor(ctx, r.proc, "redis-server at "+r.Addr, func(ctx context.Context) (bool, error) {
		owner, err := redistest.ProcessID(ctx, rc)
		if err != nil {
			return false, err
		}
		if owner != pid {
			return false, fmt.Errorf("process %d answers on %s, not redis-server (pid %d): %w", owner, r.Addr, pid, errPortTaken)
		}
		return rc.Ping(ctx).Err() == nil, nil
	})
}

// KillRedis kills Redis master i with SIGKILL; it loses its data. It does
// nothing to a master of Options.ExternalRedis.
func (c *Cluster) KillRedis(i int) {
	if p := c.Redis[i].proc; p != nil {
		p.kill()
	}
}

// RestartRedis kills Redis master i and starts it again, empty, on the same port.
func (c *Cluster) RestartRedis(ctx context.Context, i int) error {
	c.KillRedis(i)
	return c.StartRedis(ctx, i)
}
