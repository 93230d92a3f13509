package backend

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"

	zklock "github.com/lockwarden/lockwarden/internal/lock/zookeeper"
)

// TypeZooKeeper is status.type of a ZooKeeper store.
const TypeZooKeeper = "ZooKeeper"

var zookeeperStore = storeKind{
	field: "zookeeper", typ: TypeZooKeeper,
	set:           func(s Spec) bool { return s.ZooKeeper != nil },
	endpoints:     func(s Spec) []string { return slices.Clone(s.ZooKeeper.Servers) },
	endpointField: func(i int) string { return fmt.Sprintf("servers[%d]", i) },
	summary:       func(s Spec, eps string) string { return eps + orDefault(s.ZooKeeper.Root, zklock.DefaultRoot) },
	normalize: func(s Spec, out *Spec) {
		out.ZooKeeper = s.ZooKeeper.DeepCopy()
		slices.Sort(out.ZooKeeper.Servers)
	},
	newLocker: func(cfg Config, log logr.Logger) (Locker, error) {
		opts := []zklock.Option{zklock.WithLogger(log)}
		if cfg.OperationTimeout > 0 {
			opts = append(opts, zklock.WithOperationTimeout(cfg.OperationTimeout))
		}
		return zklock.New(*cfg.Engine.(*zklock.Config), opts...)
	},
	resolve: func(ctx context.Context, r *Registry, src *source, dial dialFunc) (any, []string, string, error) {
		z := src.spec.ZooKeeper
		c := zklock.Config{Servers: slices.Clone(z.Servers), Root: orDefault(z.Root, zklock.DefaultRoot), SessionTimeout: time.Duration(z.SessionTimeoutSeconds) * time.Second, MaxClockSkew: time.Duration(z.MaxClockSkewMilliseconds) * time.Millisecond, Dial: dial}
		var err error
		if c.Digest, err = r.secret(ctx, src, "digestSecretRef", z.DigestSecretRef, "a ZooKeeper digest"); err != nil {
			return nil, nil, "", err
		}
		if err := engineConfig(src.field, c.Validate); err != nil {
			return nil, nil, "", err
		}
		return &c, []string{c.Digest}, "", nil
	},
}
