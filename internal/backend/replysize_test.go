package backend

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	etcdlock "github.com/lockwarden/lockwarden/internal/lock/etcd"
	pglock "github.com/lockwarden/lockwarden/internal/lock/postgres"
	zklock "github.com/lockwarden/lockwarden/internal/lock/zookeeper"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// pingCloser is the part of a store's Locker these tests use.
type pingCloser interface {
	Ping(ctx context.Context) error
	Close() error
}

// TestStoresDescribeOversizedReplies: a tenant's server that announces a
// 1 GiB reply to the PostgreSQL, ZooKeeper or etcd engine (dialed through
// netguard's Dialer, as the operator dials it) reads in a status as the
// endpoint and ReplyTooLarge, whichever store it is. (Each store's own
// tests check that the engine refuses the reply without allocating it.)
func TestStoresDescribeOversizedReplies(t *testing.T) {
	t.Parallel()
	policy, err := netguard.NewEndpointPolicy([]string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := netguard.Dialer(netguard.DialOptions{Policy: policy, Timeout: 5 * time.Second})
	const opTimeout = 5 * time.Second
	stores := map[string]struct {
		handle    func(net.Conn)
		newLocker func(srv *rawserver.Server) (pingCloser, error)
	}{
		"postgres": {
			handle: rawserver.PostgresAnnouncing(1<<30 - 2),
			newLocker: func(srv *rawserver.Server) (pingCloser, error) {
				return pglock.New(pglock.Config{Host: srv.Host, Port: srv.Port, Database: "locks", User: "lockwarden", Dial: dial}, pglock.WithOperationTimeout(opTimeout))
			},
		},
		"zookeeper": {
			handle: func(c net.Conn) {
				if rawserver.ReadZKConnectRequest(c) != nil {
					return
				}
				_, _ = c.Write([]byte{0x40, 0, 0, 0}) // 1 GiB of connect response...
				_, _ = io.Copy(io.Discard, c)         // ...that never comes
			},
			newLocker: func(srv *rawserver.Server) (pingCloser, error) {
				return zklock.New(zklock.Config{Servers: []string{srv.Addr}, Dial: dial}, zklock.WithOperationTimeout(opTimeout))
			},
		},
		"etcd": {
			handle: rawserver.GRPC(0, 0, rawserver.GRPCAnnouncing1GiB, nil),
			newLocker: func(srv *rawserver.Server) (pingCloser, error) {
				return etcdlock.New(etcdlock.Config{Endpoints: []string{srv.Addr}, Dial: dial}, etcdlock.WithOpTimeout(opTimeout))
			},
		},
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := rawserver.Start(t, store.handle)
			l, err := store.newLocker(srv)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 2*opTimeout)
			defer cancel()
			err = l.Ping(ctx)
			t.Logf("Ping = %v", err)
			if !errors.Is(err, lock.ErrReplyTooLarge) {
				t.Fatalf("Ping = %v; want ErrReplyTooLarge", err)
			}
			if got, want := Describe(err), srv.Addr+": "+CategoryReplyTooLarge; got != want {
				t.Errorf("the status shows %q; want %q", got, want)
			}
			if got := Describe(err); strings.Contains(got, "1073741824") || strings.Contains(got, "MiB") {
				t.Errorf("the status shows %q: the engine's own words, not the category", got)
			}
			if c := Category(err); c != CategoryReplyTooLarge {
				t.Errorf("Category = %s, want %s", c, CategoryReplyTooLarge)
			}
		})
	}
}
