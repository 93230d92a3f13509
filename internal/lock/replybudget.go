package lock

import "sync/atomic"

// ReplyBudget bounds, across the connections that share it, the memory the
// replies in flight make a store's client allocate ahead of their data (a
// length or a count a reply header announces, which the client allocates
// for when it reads the header). A reply's reservation is returned when the
// reply is complete, and when its connection fails or closes: a peer that
// announces much and sends nothing holds its share only while its
// connection lives. The engines that read tenants' stores keep one per
// process each (Redis, ZooKeeper).
type ReplyBudget struct {
	max  int64
	used atomic.Int64
}

// NewReplyBudget returns a budget of max bytes.
func NewReplyBudget(max int64) *ReplyBudget { return &ReplyBudget{max: max} }

// Max returns the size of the budget, in bytes.
func (b *ReplyBudget) Max() int64 { return b.max }

// InUse returns the bytes reserved now.
func (b *ReplyBudget) InUse() int64 { return b.used.Load() }

// Reserve takes n bytes, or reports false and takes nothing.
func (b *ReplyBudget) Reserve(n int64) bool {
	for {
		cur := b.used.Load()
		if cur+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Release returns n bytes that Reserve took.
func (b *ReplyBudget) Release(n int64) { b.used.Add(-n) }
