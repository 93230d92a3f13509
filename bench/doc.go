// Package bench benchmarks lockwarden's Redis lock engine (internal/lock/redis)
// against other Go Redis lock libraries: github.com/go-redsync/redsync/v4 and
// github.com/bsm/redislock, and against the physical floor of a raw go-redis
// client.
//
// It is its own Go module (bench/go.mod) so that the other libraries never
// enter lockwarden's go.mod; it imports lockwarden's internal packages, which
// Go allows because its import path is inside github.com/lockwarden/lockwarden.
// The benchmarks start their own redis-server processes on free loopback ports
// (internal/testutil/redistest) and run every library against the same
// servers in the same run.
//
// Run them with `make bench` from the repository root, or:
//
//	cd bench && go test -run '^$' -bench . -benchmem -count 6 ./...
//
// See docs/benchmarks.md for what each benchmark measures and for results.
package bench
