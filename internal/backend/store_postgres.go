package backend

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/go-logr/logr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	pglock "github.com/lockwarden/lockwarden/internal/lock/postgres"
)

// TypePostgres is status.type of a PostgreSQL store.
const TypePostgres = "PostgreSQL"

var postgresStore = storeKind{
	field: "postgres", typ: TypePostgres,
	set: func(s Spec) bool { return s.Postgres != nil },
	endpoints: func(s Spec) []string {
		return []string{net.JoinHostPort(s.Postgres.Host, strconv.Itoa(int(pgPort(s.Postgres))))}
	},
	endpointField: func(int) string { return "host" },
	summary: func(s Spec, eps string) string {
		return fmt.Sprintf("%s/%s (schema %s)", eps, s.Postgres.Database, orDefault(s.Postgres.Schema, pglock.DefaultSchema))
	},
	normalize: func(s Spec, out *Spec) { out.Postgres = s.Postgres.DeepCopy() },
	check: func(s Spec) error {
		return checkNames([2]string{"spec.postgres.user", s.Postgres.User}, [2]string{"spec.postgres.database", s.Postgres.Database})
	},
	newLocker: func(cfg Config, log logr.Logger) (Locker, error) {
		opts := []pglock.Option{pglock.WithLogger(log)}
		if cfg.OperationTimeout > 0 {
			opts = append(opts, pglock.WithOperationTimeout(cfg.OperationTimeout))
		}
		return pglock.New(*cfg.Engine.(*pglock.Config), opts...)
	},
	resolve: func(ctx context.Context, r *Registry, src *source, dial dialFunc) (any, []string, string, error) {
		p := src.spec.Postgres
		c := pglock.Config{Host: p.Host, Port: int(pgPort(p)), Database: p.Database, User: p.User, Schema: orDefault(p.Schema, pglock.DefaultSchema), Dial: dial}
		var caPEM string
		var err error
		if c.Password, err = r.secret(ctx, src, "passwordSecretRef", p.PasswordSecretRef, "a password"); err != nil {
			return nil, nil, "", err
		}
		if c.TLS, caPEM, err = r.tlsConfig(ctx, src.secretNamespace, src.field+".tls", p.TLS, p.Host); err != nil {
			return nil, nil, "", err
		}
		if err := engineConfig(src.field, c.Validate); err != nil {
			return nil, nil, "", err
		}
		return &c, []string{c.Password}, caPEM, nil
	},
}

func pgPort(p *locksv1alpha1.PostgresBackend) int32 {
	if p.Port == 0 {
		return pglock.DefaultPort
	}
	return p.Port
}
