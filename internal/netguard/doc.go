// Package netguard makes the operator's connections to store endpoints that
// tenants write safe to open.
//
// A tenant who controls an endpoint (host:port in a DistributedLock or a
// LockBackend) controls where the operator connects. This package bounds
// that, the same way for every store (Redis, PostgreSQL, ZooKeeper, etcd):
//
//   - EndpointPolicy decides which addresses may be dialed. Loopback, the
//     unspecified address, link-local addresses and the cloud metadata
//     services are always refused unless an allow-list CIDR names them
//     explicitly; the operator adds the API server's and its own addresses
//     to the deny list. The check runs on the address actually connected to
//     (after DNS), before the connection is made.
//   - Dialer applies the policy at every connection, with a timeout and,
//     when asked, TLS; every store's client dials through it.
//
// What a peer sends back is bounded by each store's engine, which knows its
// protocol (the Redis engine's reply validator, the others' message limits);
// the words shown to tenants for a failure come from package backend
// (Category, Describe). netguard imports nothing of the operator's.
package netguard
