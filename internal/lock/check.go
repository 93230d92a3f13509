package lock

import (
	"context"
	"fmt"
)

// ConfigChecker is implemented by Lockers that can read the settings of
// their servers that lease safety depends on (the Redis Locker checks
// maxmemory-policy). Other backends do not implement it; callers
// type-assert.
type ConfigChecker interface {
	// CheckServers reads those settings on every server and returns one
	// Finding per unsafe setting. A server that refuses to show its settings
	// (an ACL without CONFIG, a renamed command) yields no finding: the
	// check is best effort and never fails a backend. The error says which
	// servers could not be reached; findings of the others are returned
	// with it.
	CheckServers(ctx context.Context) ([]Finding, error)
}

// Finding is one server setting that makes leases unsafe.
type Finding struct {
	// Node names the server as the Locker does (its address, or the
	// Sentinel master name and Sentinels).
	Node string
	// Setting is the name of the setting, for example "maxmemory-policy".
	Setting string
	// Found is its value on the server; Want the safe value.
	Found, Want string
	// Risk says what can go wrong with the value found, and Fix how to set
	// the safe value (each a clause without a final period).
	Risk, Fix string
}

// String names the node, the setting, the value found, the risk and the fix
// (the text of a status condition or Event).
func (f Finding) String() string {
	return fmt.Sprintf("%s has %s %s, not %s: %s. Fix: %s.", f.Node, f.Setting, f.Found, f.Want, f.Risk, f.Fix)
}
