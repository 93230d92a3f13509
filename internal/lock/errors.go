package lock

import (
	"errors"
	"fmt"
)

// Sentinel errors. Match them with errors.Is; the concrete errors wrap them
// together with the per-node causes.
var (
	// ErrNotAcquired: the keys are held by someone else, or a waiter is ahead in the queue.
	ErrNotAcquired = errors.New("lock not acquired")
	// ErrNotHeld: the owner token holds none of the keys (release of a lease that expired or was never held).
	ErrNotHeld = errors.New("lock not held")
	// ErrLost: a lease the caller held is gone (expired, or taken by another owner).
	ErrLost = errors.New("lease lost")
	// ErrBackendUnavailable: the backend could not be reached or answered with an error.
	ErrBackendUnavailable = errors.New("lock backend unavailable")
	// ErrQuorum: fewer than a majority of Redlock nodes agreed.
	ErrQuorum = errors.New("no quorum of lock nodes")
	// ErrInvalidRequest: the arguments are wrong; nothing was sent to the backend.
	ErrInvalidRequest = errors.New("invalid lock request")
	// ErrReplaced: a queued request was dropped from the queue by a newer
	// request with Replace (contention ReplaceQueued); it did not acquire and
	// is no longer queued.
	ErrReplaced = errors.New("queued request replaced by a newer one")
	// ErrPreempted: a newer request with Preempt (contention
	// CancelInProgress) asked the lease's holder to stop: the lease was not
	// renewed and stays valid only until its Expires; release it once the
	// work has stopped.
	ErrPreempted = errors.New("lease preempted by a newer request")
	// ErrReplyTooLarge: the backend announced a reply larger than the engine
	// accepts; the connection was dropped without reading or allocating it.
	ErrReplyTooLarge = errors.New("backend reply too large")
)

// ReplyTooLargeError is a reply whose declared length exceeds what an engine
// accepts from its store. The engine refuses it before allocating for it
// (the declared length is the peer's claim, not bytes received), and the
// connection is not used again. It matches ErrReplyTooLarge.
type ReplyTooLargeError struct {
	// Store names the protocol ("postgres", "zookeeper", "etcd").
	Store string
	// Declared is the length the peer announced, in bytes.
	Declared int64
	// Limit is the largest length accepted, in bytes.
	Limit int64
	// Detail, when set, says what inside the reply was refused (a length
	// or count declared by a field, a reply to no request) in place of
	// Declared and Limit.
	Detail string
}

func (e *ReplyTooLargeError) Error() string {
	if e.Detail != "" {
		return e.Store + " reply too large: " + e.Detail
	}
	return fmt.Sprintf("%s reply too large: the server announced %d bytes, more than the limit of %s", e.Store, e.Declared, formatBytes(e.Limit))
}

// Is makes a ReplyTooLargeError match ErrReplyTooLarge.
func (e *ReplyTooLargeError) Is(target error) bool { return target == ErrReplyTooLarge }

// formatBytes writes a size in the largest binary unit that divides it
// exactly ("4 MiB", "1536 KiB", "10 bytes").
func formatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// HeldError says who holds a key that could not be acquired. It matches ErrNotAcquired.
type HeldError struct {
	// Key is the first busy key.
	Key string
	// Holder is the identity of the current holder, when known; empty when the
	// key is free but another waiter is ahead in the queue.
	Holder string
	// Fence is the current holder's fencing token, when known.
	Fence int64
	// Position is the caller's place in the key's queue (0 = head), or -1 when not queued.
	Position int
	// Waiters is the length of the key's queue (live waiters, the caller included).
	Waiters int
	// Holders is how many leases hold the key (0 when it is free but others
	// are ahead in the queue; up to the Limit of a semaphore).
	Holders int
}

func (e *HeldError) Error() string {
	switch {
	case e.Holder != "":
		return fmt.Sprintf("lock not acquired: key %q is held by %q (fencing token %d)", e.Key, e.Holder, e.Fence)
	case e.Position > 0:
		return fmt.Sprintf("lock not acquired: key %q has %d waiter(s) ahead in the queue", e.Key, e.Position)
	case e.Position < 0 && e.Waiters > 0:
		return fmt.Sprintf("lock not acquired: key %q is free but %d waiter(s) are queued for it", e.Key, e.Waiters)
	default:
		return fmt.Sprintf("lock not acquired: key %q is busy", e.Key)
	}
}

// Is makes a HeldError match ErrNotAcquired.
func (e *HeldError) Is(target error) bool { return target == ErrNotAcquired }

// NodeError is the failure of one backend node, named by its address.
type NodeError struct {
	Node string
	Err  error
}

func (e *NodeError) Error() string { return fmt.Sprintf("node %s: %v", e.Node, e.Err) }

// Unwrap returns the node's cause.
func (e *NodeError) Unwrap() error { return e.Err }

// InvalidRequestError names the argument that is wrong and what would be valid.
type InvalidRequestError struct {
	Field  string
	Reason string
}

func (e *InvalidRequestError) Error() string {
	return fmt.Sprintf("invalid lock request: %s: %s", e.Field, e.Reason)
}

// Is makes an InvalidRequestError match ErrInvalidRequest.
func (e *InvalidRequestError) Is(target error) bool { return target == ErrInvalidRequest }
