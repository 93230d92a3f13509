package redis

// The test helpers guard_test.go (package redis_test) uses.
var (
	NewTestLocker = newTestLocker
	TLSFor        = tlsFor
	Addrs         = addrs
)
