package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// What the Locker asks of its servers (see docs/backends.md, "Redis
// requirements"). Only maxmemory-policy can be read cheaply and is checked:
// every other eviction policy may evict a held lock key (volatile-* policies
// pick among keys with a TTL, which every lock key has), and the next
// acquisition then takes the key while its holder still holds the lease.

const (
	// settingEviction is the setting CheckServers reads.
	settingEviction = "maxmemory-policy"
	// safeEviction is its only safe value: a full server refuses writes
	// (acquisitions fail) instead of dropping keys.
	safeEviction = "noeviction"
)

// configGetter is the part of a go-redis client that reads a setting
// (*goredis.Client has it, the Sentinel failover client included).
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *goredis.MapStringStringCmd
}

var _ lock.ConfigChecker = (*Locker)(nil)

// CheckServers reads maxmemory-policy on every node (the Sentinel-managed
// master in Sentinel mode) and returns a finding for each node where it is
// not noeviction. A node that refuses CONFIG GET (an ACL without it, a
// renamed command) is logged at debug level as not verified and yields no
// finding. The error joins the nodes that did not answer (*lock.NodeError);
// the findings of the nodes that did are returned with it.
func (l *Locker) CheckServers(ctx context.Context) ([]lock.Finding, error) {
	res := fanOut(ctx, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (*lock.Finding, error) {
		c, ok := n.client.(configGetter)
		if !ok {
			return nil, nil
		}
		vals, err := c.ConfigGet(ctx, settingEviction).Result()
		var rerr goredis.Error
		switch {
		case errors.As(err, &rerr):
			// The server answered but refused: not allowed to read its
			// settings. Best effort only.
			l.log.V(1).Info("Could not verify the Redis settings lock safety depends on", "node", n.name, "setting", settingEviction, "error", err.Error())
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("config get %s: %w", settingEviction, err)
		}
		policy, ok := vals[settingEviction]
		if !ok {
			l.log.V(1).Info("Could not verify the Redis settings lock safety depends on: the server does not report it", "node", n.name, "setting", settingEviction)
			return nil, nil
		}
		if policy == safeEviction {
			return nil, nil
		}
		return &lock.Finding{
			Node:    n.name,
			Setting: settingEviction,
			Found:   policy,
			Want:    safeEviction,
			Risk:    "Redis may evict a held lock key when it runs out of memory, and the next acquisition then takes the key while its holder still holds the lease",
			Fix:     "run CONFIG SET maxmemory-policy noeviction on it and set maxmemory-policy noeviction in its redis.conf",
		}, nil
	})
	var out []lock.Finding
	var errs []error
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.nodeErr())
			continue
		}
		if r.val != nil {
			out = append(out, *r.val)
		}
	}
	return out, errors.Join(errs...)
}
