package backend

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"

	etcdlock "github.com/lockwarden/lockwarden/internal/lock/etcd"
)

// TypeEtcd is status.type of an etcd store.
const TypeEtcd = "etcd"

var etcdStore = storeKind{
	field: "etcd", typ: TypeEtcd,
	set:           func(s Spec) bool { return s.Etcd != nil },
	endpoints:     func(s Spec) []string { return slices.Clone(s.Etcd.Endpoints) },
	endpointField: endpointsField,
	summary:       func(s Spec, eps string) string { return eps + " " + orDefault(s.Etcd.Prefix, etcdlock.DefaultPrefix) },
	normalize: func(s Spec, out *Spec) {
		out.Etcd = s.Etcd.DeepCopy()
		slices.Sort(out.Etcd.Endpoints)
	},
	check: func(s Spec) error {
		if (s.Etcd.Username == "") != (s.Etcd.PasswordSecretRef == nil) {
			return fmt.Errorf("spec.etcd: set username and passwordSecretRef together")
		}
		return checkNames([2]string{"spec.etcd.username", s.Etcd.Username})
	},
	newLocker: func(cfg Config, log logr.Logger) (Locker, error) {
		opts := []etcdlock.Option{etcdlock.WithLogger(log)}
		if cfg.OperationTimeout > 0 {
			opts = append(opts, etcdlock.WithOpTimeout(cfg.OperationTimeout))
		}
		return etcdlock.New(*cfg.Engine.(*etcdlock.Config), opts...)
	},
	resolve: func(ctx context.Context, r *Registry, src *source, dial dialFunc) (any, []string, string, error) {
		e := src.spec.Etcd
		c := etcdlock.Config{Endpoints: slices.Clone(e.Endpoints), Prefix: orDefault(e.Prefix, etcdlock.DefaultPrefix), Username: e.Username, Dial: dial}
		var caPEM string
		var err error
		if c.Password, err = r.secret(ctx, src, "passwordSecretRef", e.PasswordSecretRef, "a password"); err != nil {
			return nil, nil, "", err
		}
		if c.TLS, caPEM, err = r.tlsConfig(ctx, src.secretNamespace, src.field+".tls", e.TLS, ""); err != nil {
			return nil, nil, "", err
		}
		if err := engineConfig(src.field, c.Validate); err != nil {
			return nil, nil, "", err
		}
		return &c, []string{c.Password}, caPEM, nil
	},
}
