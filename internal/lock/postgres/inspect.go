package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what the database holds for each key, in order: whether a
// live lease holds it, the holders (a mutex lease, or the live semaphore
// slots: at most lock.MaxInspectHolders, oldest first, and their exact
// number in HolderCount; each with its Weight, the slots it takes, 1 for a
// mutex lease), the oldest one's holder, fencing token, acquisition and
// expiry times (the database's clock; Fence is the last token issued when
// the key is free), the head of the FIFO queue (at most
// lock.MaxInspectWaiters live waiters, oldest first) and the exact number
// of live waiters (Queued). It reads only, in one statement: a consistent
// snapshot of the keys.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := validateKeys("keys", keys); err != nil {
		return nil, err
	}
	octx, cancel := l.opContext(ctx, 0)
	defer cancel()
	out := make([]lock.KeyState, 0, len(keys))
	err := l.call(octx, fmt.Sprintf("inspect keys %q", keys), func(ctx context.Context, c *pgx.Conn) error {
		out = out[:0]
		rows, err := c.Query(ctx, l.sql.inspect, encodeKeys(keys), lock.MaxInspectWaiters, lock.MaxInspectHolders)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				st                lock.KeyState
				acquired, expires *time.Time
				slotHolders       []string
				slotFences        []int64
				slotAcq, slotExp  []time.Time
				slotWeights       []int32
				slots             int32
				holders           []string
				sinces            []time.Time
				queued            int32
			)
			if err := rows.Scan(&st.Held, &st.Holder, &st.Fence, &acquired, &expires,
				&slotHolders, &slotFences, &slotAcq, &slotExp, &slotWeights, &slots, &holders, &sinces, &queued); err != nil {
				return err
			}
			if len(out) >= len(keys) || len(holders) != len(sinces) || len(slotFences) != len(slotHolders) ||
				len(slotAcq) != len(slotHolders) || len(slotExp) != len(slotHolders) || len(slotWeights) != len(slotHolders) ||
				len(slotHolders) > int(slots) {
				return fmt.Errorf("inspect: unexpected row %d (%d holders, %d times; %d of %d slots)", len(out), len(holders), len(sinces), len(slotHolders), slots)
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
				st.Holders = []lock.HolderState{{Holder: st.Holder, Fence: st.Fence, Acquired: st.Acquired, Expires: st.Expires, Weight: 1}}
			} else if slots > 0 && len(slotHolders) > 0 {
				// Semaphore slots (acquire never leaves them beside a live
				// mutex lease): the oldest describes the key.
				st.Held, st.HolderCount = true, int(slots)
				for i, h := range slotHolders {
					st.Holders = append(st.Holders, lock.HolderState{Holder: h, Fence: slotFences[i], Acquired: slotAcq[i], Expires: slotExp[i], Weight: int(slotWeights[i])})
				}
				first := st.Holders[0]
				st.Holder, st.Fence, st.Acquired, st.Expires = first.Holder, first.Fence, first.Acquired, first.Expires
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
