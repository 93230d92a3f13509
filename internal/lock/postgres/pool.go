package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pool is a small pool of pgx connections. It exists because pgxpool needs a
// module (puddle) this repository does not require, and pgx's database/sql
// driver imports pgxpool; what the Locker needs is little: at most max
// connections, opened on demand through the configured dialer, reused
// newest first, and dropped once pgx closed them after an error.
type pool struct {
	cfg *pgx.ConnConfig
	// slots holds one token per connection in use (or being opened), so at
	// most cap(slots) connections are ever open: a connection is opened only
	// when no idle one is left.
	slots chan struct{}

	mu     sync.Mutex
	idle   []idleConn // newest last
	closed bool
}

type idleConn struct {
	c     *pgx.Conn
	since time.Time
}

const (
	// maxIdle closes connections idle longer than this when they are next
	// looked at (the server may have a shorter idle timeout of its own).
	maxIdle = 5 * time.Minute
	// pingAfter: a connection idle longer than this is pinged before use,
	// since a server restart or a dropped route closes nothing on our side.
	pingAfter = 5 * time.Second
)

var errPoolClosed = errors.New("the locker is closed")

func newPool(cfg *pgx.ConnConfig, max int) *pool {
	return &pool{cfg: cfg, slots: make(chan struct{}, max)}
}

// get returns a connection for the caller's exclusive use; give it back with put.
func (p *pool) get(ctx context.Context) (*pgx.Conn, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			<-p.slots
			return nil, errPoolClosed
		}
		var ic idleConn
		if n := len(p.idle); n > 0 {
			ic = p.idle[n-1]
			p.idle = p.idle[:n-1]
		}
		p.mu.Unlock()
		if ic.c == nil {
			break
		}
		idle := time.Since(ic.since)
		if ic.c.IsClosed() || idle > maxIdle {
			closeConn(ic.c)
			continue
		}
		if idle > pingAfter {
			if err := ic.c.Ping(ctx); err != nil {
				closeConn(ic.c)
				if ctx.Err() != nil {
					<-p.slots
					return nil, ctx.Err()
				}
				continue
			}
		}
		return ic.c, nil
	}
	c, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		<-p.slots
		return nil, err
	}
	return c, nil
}

// put gives a connection back: to the idle list when it is healthy and
// outside a transaction, else it is closed.
func (p *pool) put(c *pgx.Conn) {
	defer func() { <-p.slots }()
	if c.IsClosed() || c.PgConn().IsBusy() || c.PgConn().TxStatus() != 'I' {
		closeConn(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		closeConn(c)
		return
	}
	p.idle = append(p.idle, idleConn{c: c, since: time.Now()})
	p.mu.Unlock()
}

// close closes the idle connections; connections in use are closed when put back.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, ic := range idle {
		closeConn(ic.c)
	}
}

// closeConn closes c without waiting long for a server that may be gone.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = c.Close(ctx)
}
