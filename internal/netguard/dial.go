package netguard

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// keepAlive matches go-redis's default dialer: probe after 30s idle, every 5s, 3 times.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// DialOptions configures Dialer.
type DialOptions struct {
	// Policy decides which endpoints may be dialed; nil allows every endpoint
	// (admin-owned backends).
	Policy *EndpointPolicy
	// TLS, when set, makes every connection TLS with a clone of this
	// configuration; an empty ServerName becomes the host of the address
	// dialed, as go-redis's own dialer does. Clients that do their own TLS
	// over the connection they are handed (PostgreSQL, ZooKeeper, etcd's
	// gRPC) set none here.
	TLS *tls.Config
	// Timeout bounds the connection and the TLS handshake together, on top of
	// the context's deadline. Zero: only the context bounds them.
	Timeout time.Duration
}

// HandshakeError is a failed TLS handshake. Its cause may describe the
// peer's certificate: show tenants its category, not the text.
type HandshakeError struct {
	// Endpoint is the host:port dialed.
	Endpoint string
	// Err is the cause.
	Err error
}

// Error names the endpoint and the cause.
func (e *HandshakeError) Error() string {
	return fmt.Sprintf("TLS handshake with %s failed: %v", e.Endpoint, e.Err)
}

// Unwrap returns the cause.
func (e *HandshakeError) Unwrap() error { return e.Err }

// Dialer returns the dial function every store's client connects through
// (go-redis's Options.Dialer, pgx's DialFunc, ZooKeeper's and gRPC's
// dialers). For each connection it:
//
//  1. checks the endpoint statically (Policy.Check) and, for a host name,
//     resolves it and checks every address it resolves to;
//  2. dials TCP with a socket control hook that checks the address actually
//     connected to before connect(2) runs, so a denied address never
//     receives a packet, whatever DNS answers by then;
//  3. performs the TLS handshake when TLS is set (go-redis does not do TLS
//     itself when a Dialer is set).
//
// It reads nothing from the connection: bounding what a store sends is each
// engine's own work, as it knows the protocol (the Redis engine wraps these
// connections with its reply validator; the others bound the messages they
// read).
//
// Errors are *DeniedError, *HandshakeError, or the network's own (*net.OpError,
// *net.DNSError).
func Dialer(opts DialOptions) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var base *tls.Config
	if opts.TLS != nil {
		base = opts.TLS.Clone()
	}
	policy := opts.Policy
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if opts.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
			defer cancel()
		}
		conn, err := dialChecked(ctx, policy, network, addr, opts.Timeout)
		if err != nil {
			return nil, err
		}
		if base != nil {
			cfg := base.Clone()
			if cfg.ServerName == "" {
				host, _, err := net.SplitHostPort(addr)
				if err != nil {
					host = addr
				}
				cfg.ServerName = host
			}
			tc := tls.Client(conn, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, &HandshakeError{Endpoint: addr, Err: err}
			}
			conn = tc
		}
		return conn, nil
	}
}

// lookupNetIP resolves host names; tests replace it to play DNS.
var lookupNetIP = net.DefaultResolver.LookupNetIP

// minAttempt is the least time one address of several gets (as in package net).
const minAttempt = 2 * time.Second

// dialChecked dials TCP under the policy. A host name is resolved once; every
// address must pass the policy, and only those addresses are dialed, in
// order, until one connects. The control hook checks the address of each
// attempt again just before connect(2).
func dialChecked(ctx context.Context, p *EndpointPolicy, network, addr string, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, KeepAliveConfig: keepAlive}
	if p == nil {
		return d.DialContext(ctx, network, addr)
	}
	var lookupNet string
	switch network {
	case "tcp":
		lookupNet = "ip"
	case "tcp4":
		lookupNet = "ip4"
	case "tcp6":
		lookupNet = "ip6"
	default:
		return nil, &DeniedError{Endpoint: addr, Reason: fmt.Sprintf("network %q: only TCP endpoints are allowed", network)}
	}
	if err := p.Check(addr); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr) // Check accepted addr
	hostMatched := false
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		hostMatched = p.matchHost(normalizeHost(host))
		if ips, err = lookupNetIP(ctx, lookupNet, host); err != nil {
			return nil, err
		}
		if len(ips) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
		for _, ip := range ips {
			if err := p.checkIP(addr, ip, hostMatched); err != nil {
				return nil, err
			}
		}
	}
	d.ControlContext = p.control(addr, hostMatched)
	var firstErr error
	for i, ip := range ips {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && len(ips)-i > 1 {
			share := max(time.Until(deadline)/time.Duration(len(ips)-i), minAttempt)
			actx, cancel = context.WithTimeout(ctx, share)
		}
		conn, err := d.DialContext(actx, network, net.JoinHostPort(ip.Unmap().String(), port))
		cancel()
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// control returns the net.Dialer hook that checks the address of the socket
// about to connect (ip:port) on behalf of endpoint; a denial aborts the dial
// before connect(2).
func (p *EndpointPolicy) control(endpoint string, hostMatched bool) func(context.Context, string, string, syscall.RawConn) error {
	return func(_ context.Context, _, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return &DeniedError{Endpoint: endpoint, Reason: "the address dialed is not an IP address"}
		}
		return p.checkIP(endpoint, ap.Addr(), hostMatched)
	}
}
