package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Release frees the keys the lease's owner token still holds with a live
// lease of the lease's fencing token and notifies their release (see
// lock.Locker): a later acquisition of the same owner (a restarted operator)
// has another token and is left alone. The lease may come from another
// Locker or process: only Keys, Owner and Fence are needed. It returns an
// error matching lock.ErrNotHeld when the owner held none of them.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	octx, cancel := l.opContext(ctx, 0)
	defer cancel()
	n, err := l.release(octx, lease.Keys, lease.Owner, lease.Fence)
	if err != nil {
		return fmt.Errorf("release keys %q (fencing token %d): %w", lease.Keys, lease.Fence, err)
	}
	if n == 0 {
		return fmt.Errorf("release keys %q (fencing token %d): %w: the lease expired or another owner took it", lease.Keys, lease.Fence, lock.ErrNotHeld)
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// release calls the release function and returns how many keys it freed:
// those owner holds with fencing token fence.
func (l *Locker) release(ctx context.Context, keys []string, owner string, fence int64) (int32, error) {
	var n int32
	err := l.call(ctx, "release", func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, l.sql.release, encodeKeys(keys), ownerDigest(owner), fence).Scan(&n)
	})
	return n, err
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up) and,
// when others wait behind it on a key with room (no mutex lease, a slot
// free), wakes them. It is not an error to dequeue an owner that is not
// queued.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := validateKeys("keys", keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the owner token of the waiter is required"}
	}
	if err := validateText("owner", owner); err != nil {
		return err
	}
	octx, cancel := l.opContext(ctx, 0)
	defer cancel()
	var left int32
	return l.call(octx, fmt.Sprintf("dequeue from keys %q", keys), func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, l.sql.dequeue, encodeKeys(keys), ownerDigest(owner)).Scan(&left)
	})
}

// ownerDigest is what the tables store and compare instead of an owner
// token: its SHA-256, hex. Whoever can read the tables (a read-only role, a
// backup) learns nothing that renews or releases a lease; the token itself
// never leaves the operator. (ZooKeeper and etcd store a digest too.)
func ownerDigest(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:])
}
