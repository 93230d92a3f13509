package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what the database holds for each key, in order: whether a
// live lease holds it, its holder, fencing token (the last one issued when the
// key is free), acquisition and expiry times (the database's clock), the
// lease as the one entry of Holders (HolderCount 0 or 1: one lease per key),
// the head of the FIFO queue (at most lock.MaxInspectWaiters live waiters,
// oldest first) and the exact number of live waiters (Queued). It reads
// only, in one statement: a consistent snapshot of the keys.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := validateKeys("keys", keys); err != nil {
		return nil, err
	}
	octx, cancel := l.opContext(ctx, 0)
	defer cancel()
	out := make([]lock.KeyState, 0, len(keys))
	err := l.call(octx, fmt.Sprintf("inspect keys %q", keys), func(ctx context.Context, c *pgx.Conn) error {
		out = out[:0]
		rows, err := c.Query(ctx, l.sql.inspect, encodeKeys(keys), lock.MaxInspectWaiters)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				st                lock.KeyState
				acquired, expires *time.Time
				holders           []string
				sinces            []time.Time
				queued            int32
			)
			if err := rows.Scan(&st.Held, &st.Holder, &st.Fence, &acquired, &expires, &holders, &sinces, &queued); err != nil {
				return err
			}
			if len(out) >= len(keys) || len(holders) != len(sinces) {
				return fmt.Errorf("inspect: unexpected row %d (%d holders, %d times)", len(out), len(holders), len(sinces))
			}
			st.Key = keys[len(out)]
			if st.Held {
				if acquired != nil {
					st.Acquired = *acquired
				}
				if expires != nil {
					st.Expires = *expires
				}
				st.HolderCount = 1
				st.Holders = []lock.HolderState{{Holder: st.Holder, Fence: st.Fence, Acquired: st.Acquired, Expires: st.Expires}}
			} else {
				// A lease past its expiry is free; its row keeps the
				// holder until the next writer.
				st.Holder = ""
			}
			for i, h := range holders {
				st.Waiters = append(st.Waiters, lock.Waiter{Holder: h, Since: sinces[i]})
			}
			st.Queued = int(queued)
			out = append(out, st)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out) != len(keys) {
			return fmt.Errorf("inspect: %d rows for %d keys", len(out), len(keys))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
