package redistest

import (
	"strconv"
	"strings"
)

// The value of a held mutex lock key, as the Redis engine writes it
// (internal/lock/redis/lua/lease.lua):
//
//	<length of owner>:<owner> <fence> <acquired µs> <holder>

// LeaseOwner returns the owner token in a lock key's value, or the value
// itself when it is not a lease.
func LeaseOwner(v string) string {
	n, rest, ok := strings.Cut(v, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 0 || len(rest) <= size || rest[size] != ' ' {
		return v
	}
	return rest[:size]
}

// LeaseValue is the value of a lock key that owner holds with the given
// fencing token, acquired at acquiredMicros (server microseconds), by holder.
func LeaseValue(owner string, fence, acquiredMicros int64, holder string) string {
	return strconv.Itoa(len(owner)) + ":" + owner + " " + strconv.FormatInt(fence, 10) + " " +
		strconv.FormatInt(acquiredMicros, 10) + " " + holder
}

// LeaseFence returns the fencing token in a lock key's value, and false when
// the value is not in the one-key layout.
func LeaseFence(v string) (int64, bool) {
	owner := LeaseOwner(v)
	if owner == v {
		return 0, false
	}
	rest := v[len(strconv.Itoa(len(owner)))+1+len(owner)+1:]
	f, _, _ := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(f, 10, 64)
	return n, err == nil
}
