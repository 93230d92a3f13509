package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Replica acknowledgements (Sentinel mode, Config.MinReplicas).
//
// Redis replicates asynchronously: the master answers a script before any
// replica has its writes. When the master dies and a Sentinel promotes a
// replica that had not received an acquisition, the lease is gone from the
// new master while its holder still thinks it valid, and another owner can
// take the key: two holders at once. So in Sentinel mode every acquisition
// and renewal script is followed, in the same pipeline (one connection:
// WAIT counts the writes of the connection it is sent on), by WAIT
// numreplicas timeout, and the Locker reports only what enough replicas
// acknowledged:
//
//   - an acquisition that fewer replicas acknowledged is not held: the
//     attempt releases it (compare-and-delete, as any failed attempt) and
//     fails with a *ReplicaError (Acquire tries again);
//   - a renewal that fewer replicas acknowledged fails with a *ReplicaError,
//     matching lock.ErrBackendUnavailable like any renewal the backend could
//     not confirm: the caller keeps the lease it had, valid until its
//     previous Expires. That is what survives a failover: the replicas
//     acknowledged the acquisition or renewal that set it, so a promoted
//     replica keeps the key at least that long, while the new expiry exists
//     on the master only. The renewal is not undone on the master (a longer
//     TTL there only delays the next owner, it never admits one early), and
//     the caller may renew again before the old Expires.
//
// The fencing counter is written by the same script as the lease, so it is
// replicated with it: a promoted replica that has every acknowledged lease
// has the counter of every token handed out, and issues larger ones (besides
// the server-clock floor, which covers the counters it lacks only while its
// clock is ahead of the old master's tokens).

// ErrNotReplicated is matched (errors.Is) by every *ReplicaError.
var ErrNotReplicated = errors.New("not acknowledged by enough replicas")

// ReplicaError is an acquisition or renewal in Sentinel mode that fewer
// replicas acknowledged (Redis WAIT) than Config.MinReplicas requires,
// within the replica timeout. An acquisition that fails with it was
// released; a renewal leaves the lease valid until its previous Expires.
// It matches ErrNotReplicated and lock.ErrBackendUnavailable: what the
// master alone holds is lost if a replica is promoted, so the backend
// cannot promise the lease.
type ReplicaError struct {
	// Op names the operation, for example `acquire keys ["a"]`.
	Op string
	// Acked is how many replicas acknowledged; Needed is Config.MinReplicas.
	Acked, Needed int
	// Timeout is how long the master waited for them.
	Timeout time.Duration
	// Cause is why the acknowledgements are unknown (WAIT failed or was cut
	// short), or nil when WAIT answered.
	Cause error
}

// Error says how many replicas acknowledged and how many are required.
func (e *ReplicaError) Error() string {
	msg := fmt.Sprintf("not acknowledged by enough replicas: %s: %d of %d required replica(s) acknowledged within %v", e.Op, e.Acked, e.Needed, e.Timeout)
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is makes a ReplicaError match ErrNotReplicated and lock.ErrBackendUnavailable.
func (e *ReplicaError) Is(target error) bool {
	return target == ErrNotReplicated || target == lock.ErrBackendUnavailable
}

// Unwrap returns the cause, if any.
func (e *ReplicaError) Unwrap() error { return e.Cause }

// acks is the answer of one WAIT: how many replicas acknowledged, or why
// that is unknown. The zero value (needed 0) asks for nothing.
type acks struct {
	needed  int
	got     int
	timeout time.Duration
	err     error
}

// check returns a *ReplicaError for op when fewer replicas acknowledged than needed.
func (a acks) check(op string) error {
	if a.needed <= 0 || (a.err == nil && a.got >= a.needed) {
		return nil
	}
	return &ReplicaError{Op: op, Acked: max(a.got, 0), Needed: a.needed, Timeout: a.timeout, Cause: a.err}
}

// replicaWait is the WAIT timeout of a call tied to a lease of the given
// TTL: the replica timeout, capped at a quarter of the TTL, in whole
// milliseconds and at least one (WAIT 0 would block forever). 0 when no
// replica is required.
func (l *Locker) replicaWait(ttl time.Duration) time.Duration {
	if l.replicas <= 0 {
		return 0
	}
	return max(min(l.opts.replicaTimeout, ttl/4).Truncate(time.Millisecond), time.Millisecond)
}

// runAcked runs a script like run and, when replicas are required and
// needsAck says the reply is a write that must survive a failover (a grant,
// a renewal), sends WAIT right after it on the same connection (WAIT counts
// the writes of the connection it is sent on), with the timeout of
// replicaWait(ttl). ctx must leave room for both. A refusal is not waited
// for: it did not change the lease.
func (l *Locker) runAcked(ctx context.Context, s *goredis.Script, c client, name string, ttl time.Duration, needsAck func(any) bool, keys []string, args ...any) (any, acks, error) {
	if l.replicas <= 0 {
		v, err := run(ctx, s, c, name, keys, args...)
		return v, acks{}, err
	}
	conn := c.Conn()
	defer conn.Close()
	v, err := run(ctx, s, conn, name, keys, args...)
	if err != nil || !needsAck(v) {
		return v, acks{}, err
	}
	return v, l.waitAcks(ctx, conn, ttl), nil
}

// waitAcks sends WAIT for the required replicas on conn, with the timeout
// of replicaWait(ttl), and returns its answer.
func (l *Locker) waitAcks(ctx context.Context, conn *goredis.Conn, ttl time.Duration) acks {
	a := acks{needed: l.replicas, timeout: l.replicaWait(ttl)}
	n, err := conn.Wait(ctx, a.needed, a.timeout).Result()
	a.got, a.err = int(n), err
	return a
}
