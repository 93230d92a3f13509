// Package netguard makes the operator's connections to Redis endpoints that
// tenants write safe to open.
//
// A tenant who controls an endpoint (host:port in a DistributedLock) controls
// where the operator connects and what it reads back. This package bounds both:
//
//   - EndpointPolicy decides which addresses may be dialed. Loopback, the
//     unspecified address, link-local addresses and the cloud metadata
//     services are always refused unless an allow-list CIDR names them
//     explicitly; the operator adds the API server's and its own addresses
//     to the deny list. The check runs on the address actually connected to
//     (after DNS), before the connection is made.
//   - LimitReplies wraps a connection so that what it reads must be a
//     well-formed RESP2/RESP3 stream within Limits: a peer that is not a Redis
//     server, or that announces a reply too large to hold, fails the read
//     before the client allocates anything for it.
//   - Dialer combines both (with TLS) into a go-redis Options.Dialer.
//   - Category and Describe turn any error of the lock engine into a fixed
//     vocabulary that is safe to show to tenants: never the peer's bytes.
package netguard
