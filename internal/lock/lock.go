// Package lock defines lockwarden's backend-neutral lease API: a Locker
// acquires, renews, releases and inspects leases on one or more keys, and tells
// its callers when keys are released so waiters need not poll.
//
// A lease is held all-or-nothing on its keys, identified by a random owner
// token that only its holder knows, and carries a fencing token that is
// strictly larger than every token issued before it for any of its keys.
//
// Each store is a package below this one (redis, postgres, zookeeper, etcd,
// and memory, the in-process reference), built from the kit here: Options
// and ConfigError (kit.go), the blocking Acquire over one attempt
// (acquire.go) and the checks of requests and leases (request.go). Every
// store must pass the conformance, semaphore and fault suites of package
// lock/locktest.
package lock

import (
	"context"
	"time"
)

const (
	// MaxKeys is the largest number of keys one lease may hold.
	MaxKeys = 16
	// MinTTL is the shortest lease TTL a Locker accepts.
	MinTTL = 100 * time.Millisecond
	// MaxFence bounds fencing tokens so that JSON clients (and kubectl) show
	// them exactly: every token is below 2^53.
	MaxFence int64 = 1<<53 - 1
)

// Request describes one acquisition.
type Request struct {
	// Keys are the lock keys, held all-or-nothing: 1 to MaxKeys, unique, non-empty.
	Keys []string
	// TTL is how long the lease lives in the backend unless renewed; at least MinTTL.
	TTL time.Duration
	// Owner is the secret owner token. Empty: the Locker generates 128 random
	// bits. A caller that must recover its lease after a restart (the operator)
	// generates and stores it itself with NewOwnerToken.
	Owner string
	// Holder is a human-readable identity stored beside the lease so that
	// Inspect can say who holds it (for example "cluster/ns/Job/name/uid").
	// Optional; never used for authorization.
	Holder string
	// Queue makes the request wait its turn in the keys' FIFO queues: a request
	// that finds a key busy joins the queue, and a free key is taken only by the
	// head of its queue. A waiter keeps its place by calling again within the
	// backend's waiter TTL; one that does not is pruned and, when it calls
	// again, joins at the back. Default false: the request does not join the
	// queues, and does not jump them either: it takes a free key only while
	// nobody waits for it, and fails with ErrNotAcquired while others are
	// queued, even when nobody holds the key.
	Queue bool
	// Limit is how many leases may hold each key at once: 0 or 1 make the
	// lease exclusive (a mutex), N > 1 a counting semaphore with N slots,
	// each holder with its own fencing token (strictly increasing per key
	// across all holders). Every request for a key should give the same
	// Limit; a request is admitted against the smallest limit of its own and
	// the live holders', so no holder shares a key with more holders than
	// its own Limit allows. With Queue, waiters
	// are admitted in FIFO order: the first free slots go to the oldest
	// waiters. At most MaxLimit. Every store has semaphores.
	Limit int
	// Replace, with Queue, makes the request the newest-only waiter of its
	// keys (contention ReplaceQueued): when it is refused and joins the
	// queues, or finds its keys free while others wait, every waiter that
	// was queued on any of its keys before it is dropped from that key's
	// queue, and that waiter's TryAcquire calls fail with an error matching
	// ErrReplaced, for at least the waiter TTL after the drop, instead of
	// queueing it again (Acquire returns that error at once). The dropped waiters no longer count as
	// waiting; a request that joins after it queues behind it as usual. A
	// request that finds its keys free once the older waiters are dropped
	// takes them at once.
	Replace bool
	// Preempt, with Queue and Replace, also stops the holders of its keys
	// (contention CancelInProgress): every lease that holds one of the keys
	// when the request is refused is preempted. A preempted lease can no
	// longer be renewed: Renew (and RenewAll) fail with an error matching
	// ErrPreempted and leave it as it was, valid until its Expires (it is
	// never shortened, so its holder's view stays safe); its holder should
	// stop its work and Release it, and the request takes the keys then,
	// or when the lease's TTL ends, with a larger fencing token. Leases
	// acquired after the preemption are not affected, and the owner of a
	// preempted lease does not take the key again by acquiring it anew
	// while others wait: it is refused like anyone else. Exclusive
	// requests only (Limit 0 or 1).
	Preempt bool
	// Boost, with Queue, is the request's priority as a head start in the
	// queues: it queues as if it had arrived Boost earlier than it did.
	// A key's queue is ordered by arrival minus Boost (arrival on the
	// store's clock, kept monotonic, so that equal boosts keep exact FIFO
	// order): a waiter is overtaken only by requests that arrive less
	// than their Boost after it, and once it has waited as long as the
	// largest Boost its keys' requests use (MaxBoost at most), no later
	// arrival goes ahead of it. That is priority with aging, the bypass
	// bounded by the largest Boost. A waiter keeps the place it joined
	// with while it calls again. 0 to MaxBoost; default 0 (FIFO).
	Boost time.Duration
	// Weight, with Limit > 1, is how many of the semaphore's slots the
	// request takes: 1 to Limit (0 means 1). The weights of the leases
	// holding a key never sum to more than the smallest Limit among them.
	// Admission stays strict FIFO by weight: a waiter takes its slots only
	// when the weights of the waiters ahead of it and its own fit in the
	// free slots, so a heavy waiter at the head of the queue is never
	// passed by lighter ones behind it, even while a slot is free; it waits
	// only for holders to release (at most the longest remaining lease of
	// those holding when it reached the head, as nobody new is admitted
	// meanwhile). A request without Queue takes free slots only while
	// nobody waits, as with weight 1. An owner that holds a slot and
	// acquires again has its slot replaced as with weight 1, whatever the
	// weight: ask again with the weight it holds. A store that does not
	// take weighted requests refuses a Weight above 1 with an
	// InvalidRequestError.
	Weight int
}

// Slots returns the number of slots req takes (Weight, at least 1).
func (r Request) Slots() int { return max(r.Weight, 1) }

// MaxBoost is the largest Request.Boost: a day.
const MaxBoost = 24 * time.Hour

// MaxLimit is the largest Request.Limit.
const MaxLimit = 1000

// Holders returns the number of leases req admits per key (Limit, at least 1).
func (r Request) Holders() int { return max(r.Limit, 1) }

// Lease is a held lock.
type Lease struct {
	// Keys are the keys held, as requested.
	Keys []string
	// Owner is the owner token: whoever knows it can renew and release.
	Owner string
	// Holder is the identity given in the Request.
	Holder string
	// Fence is the fencing token: strictly larger than any token issued before
	// for any of Keys, and below MaxFence. Hand it to the resource the holder
	// writes to, which rejects writes with a smaller token than it has seen.
	Fence int64
	// TTL is the lease TTL last set in the backend.
	TTL time.Duration
	// Acquired is when the acquisition started, on the Locker's clock.
	Acquired time.Time
	// Expires is the end of the validity the caller may rely on: the start of
	// the last successful acquire or renew plus TTL, minus elapsed time and
	// clock drift. Past it the lease must be treated as lost.
	Expires time.Time
	// Limit is the Request's Limit: a lease with Limit > 1 holds one slot of
	// a semaphore. Renew and Release need it (set by TryAcquire/Acquire;
	// callers that rebuild a lease to recover it set it themselves).
	Limit int
	// Weight is the Request's Weight: the slots the lease takes (0 or 1:
	// one).
	Weight int
}

// Waiter is one entry of a key's FIFO queue.
type Waiter struct {
	// Holder is the identity the waiter gave.
	Holder string
	// Since is when it joined the queue, on the backend's clock.
	Since time.Time
}

// HolderState is one lease holding a key.
type HolderState struct {
	// Holder is the holder identity stored with the lease.
	Holder string
	// Fence is the lease's fencing token.
	Fence int64
	// Acquired is when the lease was acquired, on the backend's clock.
	Acquired time.Time
	// Expires is when the lease expires in the backend unless renewed.
	Expires time.Time
	// Unconfirmed is set when only some nodes of a Redlock backend answered
	// and they show the lease on fewer of them than its quorum, but the
	// nodes that did not answer could hold the rest: the lease may hold the
	// key, and no other lease can take it while those nodes stay away.
	// Reported as a holder so that such a key is never shown as free.
	Unconfirmed bool
	// Weight is the slots of a semaphore the lease takes (Request.Weight;
	// 0 or 1: one).
	Weight int
}

// MaxInspectHolders bounds KeyState.Holders: the largest maxHolders the
// DistributedLock API allows, so that the operator sees every holder of its
// locks (and recovers their leases after a restart). MaxInspectWaiters bounds
// KeyState.Waiters.
const (
	MaxInspectHolders = 100
	MaxInspectWaiters = 10
)

// KeyState is what the backend holds for one key. Held, Holder, Fence,
// Acquired and Expires describe the oldest holder (the only one of a mutex).
type KeyState struct {
	// Key is the key as requested (without any backend prefix).
	Key string
	// Held tells whether a lease holds the key now.
	Held bool
	// Holder is the holder identity stored with the lease (empty when free).
	Holder string
	// Fence is the fencing token of the current lease, or the last one issued
	// when the key is free (0 when none is known).
	Fence int64
	// Acquired is when the current lease was acquired, on the backend's clock
	// (zero when free).
	Acquired time.Time
	// Expires is when the lease expires in the backend unless renewed.
	Expires time.Time
	// Holders are the leases holding the key, oldest first (at most
	// MaxInspectHolders; a semaphore's slots).
	Holders []HolderState
	// HolderCount is the exact number of leases holding the key.
	HolderCount int
	// Waiters is the head of the key's FIFO queue, oldest first (at most
	// MaxInspectWaiters live waiters).
	Waiters []Waiter
	// Queued is the exact number of live waiters in the key's queue.
	Queued int
}

// Locker is a lease backend. Every method is safe for concurrent use.
type Locker interface {
	// TryAcquire makes one attempt. When any key is held by someone else, or
	// req.Queue is set and another waiter is ahead, it returns an error that
	// matches ErrNotAcquired; with req.Queue the request stays in the queues
	// (refresh it by calling again, before WaiterTTL runs out, or leave with
	// Dequeue).
	TryAcquire(ctx context.Context, req Request) (*Lease, error)
	// Acquire blocks until the lease is held or ctx ends, retrying at once when
	// a key is released and otherwise with exponential backoff and jitter.
	Acquire(ctx context.Context, req Request) (*Lease, error)
	// Renew extends the lease to ttl from now if this acquisition (the owner
	// token with the lease's fencing token) still holds every key; otherwise
	// it returns an error matching ErrLost and the lease is gone. A later
	// acquisition of the same owner (a new token) replaced the lease: renewing
	// the old one reports it lost and leaves the new one alone. A lost lease
	// is never re-acquired behind the caller's back.
	Renew(ctx context.Context, lease *Lease, ttl time.Duration) (*Lease, error)
	// RenewAll renews many leases in as few round trips as the backend allows
	// (one per node), returning a renewed lease or an error for each, by index.
	RenewAll(ctx context.Context, leases []*Lease, ttl time.Duration) ([]*Lease, []error)
	// Release deletes the keys that this acquisition (the owner token with
	// the lease's fencing token) still holds and notifies waiters; a later
	// acquisition of the same owner is left alone. It returns an error
	// matching ErrNotHeld when it held none.
	Release(ctx context.Context, lease *Lease) error
	// Dequeue removes the owner from the keys' FIFO queues (a waiter giving up).
	Dequeue(ctx context.Context, keys []string, owner string) error
	// Inspect reports what the backend holds for each key.
	Inspect(ctx context.Context, keys []string) ([]KeyState, error)
	// Watch delivers the names of released keys until ctx ends; with no keys,
	// releases of every key on this backend. Delivery is best effort: a waiter
	// must also poll.
	Watch(ctx context.Context, keys ...string) (<-chan string, error)
	// Close releases the backend's connections; held leases stay in the
	// backend until released or expired.
	Close() error
}
