package netguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// ErrDenied is matched (errors.Is) by every *DeniedError.
var ErrDenied = errors.New("endpoint denied by network policy")

// DeniedError is an endpoint the EndpointPolicy refuses. No connection was
// made. It matches ErrDenied.
type DeniedError struct {
	// Endpoint is the host:port that was to be dialed, as given.
	Endpoint string
	// Reason is the policy's own explanation: which class of address (or which
	// rule) refused it. It never contains anything read from the network.
	Reason string
}

// Error names the endpoint and the reason.
func (e *DeniedError) Error() string {
	return fmt.Sprintf("endpoint %q denied by network policy: %s", e.Endpoint, e.Reason)
}

// Is makes a DeniedError match ErrDenied.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// Denial classes, the start of every DeniedError.Reason the policy produces.
const (
	classLoopback    = "loopback address"
	classUnspecified = "unspecified address (reaches this host)"
	classLinkLocal   = "link-local or cloud metadata address"
	classDenyList    = "API server or operator address (deny list)"
	classNotAllowed  = "not in the allow-list"
)

// defaultDeny is refused unless an allow-list CIDR explicitly covers the
// address: the allow prefix must be at least as long as the default one it
// overlaps (127.0.0.1/32 re-allows a loopback address; 0.0.0.0/0 does not).
var defaultDeny = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("127.0.0.0/8"), classLoopback},
	{netip.MustParsePrefix("::1/128"), classLoopback},
	{netip.MustParsePrefix("0.0.0.0/8"), classUnspecified},
	{netip.MustParsePrefix("::/128"), classUnspecified},
	{netip.MustParsePrefix("169.254.0.0/16"), classLinkLocal},
	{netip.MustParsePrefix("fe80::/10"), classLinkLocal},
	{netip.MustParsePrefix("fd00:ec2::254/128"), classLinkLocal},  // AWS metadata over IPv6
	{netip.MustParsePrefix("100.100.100.200/32"), classLinkLocal}, // Alibaba Cloud metadata
	{netip.MustParsePrefix("fd00:ec2::23/128"), classLinkLocal},   // AWS DNS and time over IPv6
	{netip.MustParsePrefix("fd20:ce::254/128"), classLinkLocal},   // Google Cloud metadata over IPv6
	{netip.MustParsePrefix("168.63.129.16/32"), classLinkLocal},   // Azure WireServer
	{netip.MustParsePrefix("192.0.0.192/32"), classLinkLocal},     // Oracle Cloud metadata
}

// nat64 is the well-known NAT64 prefix (RFC 6052): an address in it reaches
// the IPv4 address in its last 32 bits, so the deny checks also apply to that.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// EndpointPolicy decides which store endpoints may be dialed. Build it with
// NewEndpointPolicy. A nil *EndpointPolicy allows everything (for
// admin-owned backends); methods accept a nil receiver.
//
// Rules, in order:
//  1. An address in the deny list, or learned (SetLearned), is refused.
//  2. Loopback (127.0.0.0/8, ::1), unspecified (0.0.0.0/8, ::), link-local
//     and cloud metadata addresses (169.254.0.0/16, fe80::/10,
//     fd00:ec2::254, fd00:ec2::23, fd20:ce::254, 100.100.100.200,
//     168.63.129.16, 192.0.0.192) are refused unless an allow CIDR at
//     least as specific as the default range covers the address.
//  3. With an empty allow-list, everything else is allowed. Otherwise the
//     endpoint's host must match a host pattern, or its IP (an IP literal, or
//     every address its name resolves to) must lie in an allow CIDR.
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are checked as the IPv4 address.
type EndpointPolicy struct {
	allowNets   []netip.Prefix
	allowHosts  map[string]bool // exact names, lower case, no trailing dot
	allowSuffix []string        // ".example.com" for "*.example.com"
	deny        []netip.Prefix
	// learned are addresses of the cluster itself that the operator finds
	// at run time (SetLearned): denied like deny, and replaced as a whole.
	learned atomic.Pointer[[]netip.Addr]
}

// SetLearned replaces the addresses denied besides the deny list: those of
// the API server and the operator's own pods and Services, which change
// while the operator runs (a replica rescheduled, a Service recreated).
// Entries that are not IP addresses are ignored; it returns how many were
// taken. Safe for concurrent use with the checks.
func (p *EndpointPolicy) SetLearned(addrs []string) int {
	if p == nil {
		return 0
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			out = append(out, ip.WithZone("").Unmap())
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	out = slices.Compact(out)
	p.learned.Store(&out)
	return len(out)
}

// Learned returns the addresses SetLearned last set, sorted.
func (p *EndpointPolicy) Learned() []string {
	if p == nil {
		return nil
	}
	l := p.learned.Load()
	if l == nil {
		return nil
	}
	out := make([]string, len(*l))
	for i, a := range *l {
		out[i] = a.String()
	}
	return out
}

// NewEndpointPolicy builds a policy. allow entries are CIDRs ("10.0.0.0/8",
// "fd00::/8"), single IP addresses, exact host names
// ("redis.infra.svc.cluster.local") or suffix wildcards
// ("*.infra.svc.cluster.local", which matches any name that ends with
// ".infra.svc.cluster.local" but not that name itself); names match
// case-insensitively. deny entries are CIDRs or IP addresses. An empty allow
// means every address outside the default and explicit deny lists is allowed.
// The error names the first bad entry and says what is accepted.
func NewEndpointPolicy(allow, deny []string) (*EndpointPolicy, error) {
	p := &EndpointPolicy{allowHosts: map[string]bool{}}
	for i, raw := range allow {
		e := strings.TrimSpace(raw)
		if pfx, ok, err := parseNet(e); ok {
			if err != nil {
				return nil, fmt.Errorf("allow[%d] %q: %w; use a CIDR such as 10.0.0.0/8, an IP address, a host name or *.domain", i, raw, err)
			}
			p.allowNets = append(p.allowNets, pfx)
			continue
		}
		name, wildcard, err := parseHostPattern(e)
		if err != nil {
			return nil, fmt.Errorf("allow[%d] %q: %w; use a CIDR such as 10.0.0.0/8, an IP address, a host name such as redis.infra.svc.cluster.local, or a suffix wildcard such as *.infra.svc.cluster.local", i, raw, err)
		}
		if wildcard {
			p.allowSuffix = append(p.allowSuffix, "."+name)
		} else {
			p.allowHosts[name] = true
		}
	}
	for i, raw := range deny {
		e := strings.TrimSpace(raw)
		pfx, ok, err := parseNet(e)
		if !ok || err != nil {
			why := "not an IP address or CIDR"
			if err != nil {
				why = err.Error()
			}
			return nil, fmt.Errorf("deny[%d] %q: %s; use an IP address such as 10.96.0.1 or a CIDR such as 10.96.0.0/12", i, raw, why)
		}
		p.deny = append(p.deny, pfx)
	}
	return p, nil
}

// parseNet parses a CIDR or a bare IP address. ok is false when e looks like
// neither (it may then be a host pattern); err is set when it looks like one
// but is malformed.
func parseNet(e string) (pfx netip.Prefix, ok bool, err error) {
	if strings.Contains(e, "/") {
		pfx, err := netip.ParsePrefix(e)
		if err != nil {
			return netip.Prefix{}, true, errors.New("not a valid CIDR")
		}
		if pfx.Addr().Zone() != "" {
			return netip.Prefix{}, true, errors.New("a CIDR must not have an IPv6 zone")
		}
		return normalizePrefix(pfx), true, nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		a = a.WithZone("").Unmap()
		return netip.PrefixFrom(a, a.BitLen()), true, nil
	}
	if strings.Contains(e, ":") {
		return netip.Prefix{}, true, errors.New("not a valid IP address")
	}
	return netip.Prefix{}, false, nil
}

// normalizePrefix masks the prefix and turns ::ffff:a.b.c.d/n (n >= 96) into
// the IPv4 prefix it covers.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// parseHostPattern validates an exact name or "*.suffix" and returns the name
// (or the suffix) in lower case without a trailing dot.
func parseHostPattern(e string) (name string, wildcard bool, err error) {
	if e == "" {
		return "", false, errors.New("empty entry")
	}
	if rest, ok := strings.CutPrefix(e, "*."); ok {
		wildcard, e = true, rest
	}
	if strings.Contains(e, "*") {
		return "", false, errors.New("a wildcard is only allowed as the whole first label (*.domain)")
	}
	name = normalizeHost(e)
	if err := validHostName(name); err != nil {
		return "", false, err
	}
	return name, wildcard, nil
}

func normalizeHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// validHostName checks DNS name syntax (letters, digits, '-', '_', labels of
// 1 to 63 characters, at most 253 in all).
func validHostName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a valid host name")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("not a valid host name")
		}
		for i := 0; i < len(label); i++ {
			if !hostNameByte(label[i]) {
				return errors.New("not a valid host name")
			}
		}
	}
	return nil
}

func hostNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// Check is the static check of an endpoint, without DNS: an IP literal is
// checked completely; a host name is refused when it is "localhost" (or a
// subdomain of it) unless an allow CIDR covers loopback, and, when the
// allow-list has host patterns but no CIDRs, when it matches none of them.
// A name that passes is checked again at dial time, on every address it
// resolves to. The error is a *DeniedError.
func (p *EndpointPolicy) Check(hostport string) error {
	if p == nil {
		return nil
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" {
		return &DeniedError{Endpoint: hostport, Reason: "not host:port"}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return &DeniedError{Endpoint: hostport, Reason: "the port must be a number from 1 to 65535"}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return p.checkIP(hostport, ip, false)
	}
	name := normalizeHost(host)
	if err := validHostName(name); err != nil {
		return &DeniedError{Endpoint: hostport, Reason: "not a valid host name"}
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		if !p.explicitlyAllowed(netip.MustParseAddr("127.0.0.1"), 8) && !p.explicitlyAllowed(netip.IPv6Loopback(), 128) {
			return &DeniedError{Endpoint: hostport, Reason: fmt.Sprintf("%s: %q is this host", classLoopback, host)}
		}
	}
	if p.hasAllow() && !p.matchHost(name) && len(p.allowNets) == 0 {
		return &DeniedError{Endpoint: hostport, Reason: fmt.Sprintf("%s: host %q matches no allowed host pattern", classNotAllowed, host)}
	}
	return nil
}

// hasAllow reports whether an allow-list is set.
func (p *EndpointPolicy) hasAllow() bool {
	return len(p.allowNets) > 0 || len(p.allowHosts) > 0 || len(p.allowSuffix) > 0
}

// matchHost reports whether a normalized host name matches a host pattern.
func (p *EndpointPolicy) matchHost(name string) bool {
	if p.allowHosts[name] {
		return true
	}
	for _, s := range p.allowSuffix {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// explicitlyAllowed reports whether an allow CIDR of at least minBits covers ip.
func (p *EndpointPolicy) explicitlyAllowed(ip netip.Addr, minBits int) bool {
	for _, a := range p.allowNets {
		if a.Bits() >= minBits && a.Contains(ip) {
			return true
		}
	}
	return false
}

// checkIP applies the rules to one address. hostMatched says the endpoint's
// name matched an allowed host pattern (then the allow CIDRs are not needed,
// but the deny rules still apply).
func (p *EndpointPolicy) checkIP(endpoint string, ip netip.Addr, hostMatched bool) error {
	if p == nil {
		return nil
	}
	ip = ip.WithZone("").Unmap()
	candidates := []netip.Addr{ip}
	if nat64.Contains(ip) {
		b := ip.As16()
		candidates = append(candidates, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	}
	for _, c := range candidates {
		for _, d := range p.deny {
			if d.Contains(c) {
				return &DeniedError{Endpoint: endpoint, Reason: fmt.Sprintf("%s: %s", classDenyList, ip)}
			}
		}
		if l := p.learned.Load(); l != nil {
			if _, found := slices.BinarySearchFunc(*l, c, func(a, b netip.Addr) int { return a.Compare(b) }); found {
				return &DeniedError{Endpoint: endpoint, Reason: fmt.Sprintf("%s: %s", classDenyList, ip)}
			}
		}
		for _, d := range defaultDeny {
			if d.prefix.Contains(c) && !p.explicitlyAllowed(c, d.prefix.Bits()) {
				return &DeniedError{Endpoint: endpoint, Reason: fmt.Sprintf("%s: %s", d.class, ip)}
			}
		}
	}
	if !p.hasAllow() || hostMatched || p.explicitlyAllowed(ip, 0) {
		return nil
	}
	return &DeniedError{Endpoint: endpoint, Reason: fmt.Sprintf("%s: %s is in no allowed CIDR", classNotAllowed, ip)}
}
