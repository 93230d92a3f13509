package backend

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"

	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
)

// TypeRedis is status.type of a Redis store.
const TypeRedis = "Redis"

var redisStore = storeKind{
	field: "redis", typ: TypeRedis, boundedCalls: true,
	set:           func(s Spec) bool { return s.Redis != nil },
	endpoints:     func(s Spec) []string { return slices.Clone(s.Redis.Endpoints) },
	endpointField: endpointsField,
	summary: func(s Spec, eps string) string {
		if s.Redis.Sentinel != nil {
			return fmt.Sprintf("%s (sentinel %s, db %d)", eps, s.Redis.Sentinel.MasterName, s.Redis.DB)
		}
		return fmt.Sprintf("%s (db %d)", eps, s.Redis.DB)
	},
	normalize: func(s Spec, out *Spec) {
		out.Redis = s.Redis.DeepCopy()
		slices.Sort(out.Redis.Endpoints)
	},
	check: func(s Spec) error {
		names := [][2]string{{"spec.redis.username", s.Redis.Username}}
		if s.Redis.Sentinel != nil {
			names = append(names, [2]string{"spec.redis.sentinel.masterName", s.Redis.Sentinel.MasterName})
		}
		return checkNames(names...)
	},
	newLocker: func(cfg Config, log logr.Logger) (Locker, error) {
		return redislock.New(*cfg.Engine.(*redislock.Config), redislock.WithLogger(log))
	},
	resolve: func(ctx context.Context, r *Registry, src *source, _ dialFunc) (any, []string, string, error) {
		c, caPEM, err := r.resolveRedis(ctx, src)
		if err != nil {
			return nil, nil, "", err
		}
		return &c, []string{c.Password, c.SentinelPassword}, caPEM, nil
	},
}

// resolveRedis builds a Redis engine configuration (and returns the CA PEM
// it read). The Redis engine is handed the endpoint policy rather than a
// dial function: it builds the same netguard.Dialer with the policy, its
// TLS (go-redis does no TLS over a dialer it is given) and its own connect
// timeout, and bounds the replies on top (lock/redis's reply validator).
func (r *Registry) resolveRedis(ctx context.Context, src *source) (redislock.Config, string, error) {
	rb, ns := src.spec.Redis, src.secretNamespace
	cfg := redislock.Config{Addrs: slices.Clone(rb.Endpoints), DB: int(rb.DB), Username: rb.Username, Prefix: KeyPrefix, Scopes: slices.Clone(src.scopes), EndpointPolicy: src.endpoints}
	var err error
	if cfg.Password, err = r.secret(ctx, src, "passwordSecretRef", rb.PasswordSecretRef, "a password"); err != nil {
		return cfg, "", err
	}
	if s := rb.Sentinel; s != nil {
		cfg.MasterName = s.MasterName
		switch {
		case s.MinReplicas == nil:
			// The engine's default (redislock.DefaultMinReplicas).
		case *s.MinReplicas == 0:
			cfg.MinReplicas = redislock.NoReplicas
		default:
			cfg.MinReplicas = int(*s.MinReplicas)
		}
		if cfg.SentinelPassword, err = r.secret(ctx, src, "sentinel.passwordSecretRef", s.PasswordSecretRef, "a password"); err != nil {
			return cfg, "", err
		}
	}
	var caPEM string
	if cfg.TLS, caPEM, err = r.tlsConfig(ctx, ns, src.field+".tls", rb.TLS, ""); err != nil {
		return cfg, "", err
	}
	return cfg, caPEM, engineConfig(src.field, cfg.Validate)
}
