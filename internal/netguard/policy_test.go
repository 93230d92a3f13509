package netguard

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func mustPolicy(t *testing.T, allow, deny []string) *EndpointPolicy {
	t.Helper()
	p, err := NewEndpointPolicy(allow, deny)
	if err != nil {
		t.Fatalf("NewEndpointPolicy(%q, %q): %v", allow, deny, err)
	}
	return p
}

// verdict is what a test expects of Check: "" for allowed, else the class
// the reason must start with.
func verdictOf(t *testing.T, endpoint string, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	var de *DeniedError
	if !errors.As(err, &de) || !errors.Is(err, ErrDenied) {
		t.Fatalf("Check(%q) = %v (%T), want a *DeniedError matching ErrDenied", endpoint, err, err)
	}
	if de.Endpoint != endpoint {
		t.Errorf("Check(%q): DeniedError.Endpoint = %q", endpoint, de.Endpoint)
	}
	return de.Reason
}

func TestPolicyCheck(t *testing.T) {
	const (
		allowed     = ""
		loopback    = classLoopback
		unspecified = classUnspecified
		linkLocal   = classLinkLocal
		denyList    = classDenyList
		notAllowed  = classNotAllowed
		malformed   = "!"
	)
	cases := []struct {
		name        string
		allow, deny []string
		want        map[string]string // endpoint -> verdict
	}{{
		name: "default deny only",
		want: map[string]string{
			"169.254.169.254:80":          linkLocal,
			"169.254.170.2:80":            linkLocal, // ECS task metadata
			"[fe80::1]:6379":              linkLocal,
			"[fe80::1%eth0]:6379":         linkLocal,
			"[fd00:ec2::254]:80":          linkLocal,
			"100.100.100.200:80":          linkLocal,
			"[fd00:ec2::23]:53":           linkLocal,
			"[fd20:ce::254]:80":           linkLocal,
			"168.63.129.16:80":            linkLocal,
			"192.0.0.192:80":              linkLocal,
			"[::ffff:169.254.169.254]:80": linkLocal,
			"[64:ff9b::a9fe:a9fe]:80":     linkLocal, // metadata through NAT64
			"127.0.0.1:6379":              loopback,
			"127.1.2.3:6379":              loopback,
			"[::1]:6379":                  loopback,
			"[::ffff:127.0.0.1]:6379":     loopback,
			"[::ffff:7f00:1]:6379":        loopback,
			"localhost:6379":              loopback,
			"LocalHost.:6379":             loopback,
			"redis.localhost:6379":        loopback,
			"0.0.0.0:6379":                unspecified,
			"[::]:6379":                   unspecified,
			"10.0.0.7:6379":               allowed,
			"[2001:db8::1]:6379":          allowed,
			"100.100.100.201:6379":        allowed,
			"redis.example.com:6379":      allowed, // names are checked again at dial time
			"redis:6379":                  allowed,
			"no-port":                     malformed,
			"redis:0":                     malformed,
			"redis:65536":                 malformed,
			"redis:name":                  malformed,
			":6379":                       malformed,
			"bad host!:6379":              malformed,
		},
	}, {
		name: "deny list",
		deny: []string{"10.96.0.1", "10.244.1.0/24", "fd00:10:96::1"},
		want: map[string]string{
			"10.96.0.1:443":          denyList,
			"[::ffff:10.96.0.1]:443": denyList,
			"10.244.1.17:6379":       denyList,
			"[fd00:10:96::1]:443":    denyList,
			"10.96.0.2:443":          allowed,
			"169.254.169.254:80":     linkLocal,
			"[64:ff9b::a60:1]:443":   denyList, // 10.96.0.1 through NAT64
			"kubernetes.default:443": allowed,  // resolved at dial time
		},
	}, {
		name:  "allow CIDRs",
		allow: []string{"10.0.0.0/8", "fd00::/8"},
		deny:  []string{"10.96.0.1/32"},
		want: map[string]string{
			"10.1.2.3:6379":          allowed,
			"[fd12::1]:6379":         allowed,
			"[::ffff:10.1.2.3]:6379": allowed,
			"192.168.1.1:6379":       notAllowed,
			"[2001:db8::1]:6379":     notAllowed,
			"10.96.0.1:443":          denyList, // the deny list wins over the allow-list
			"127.0.0.1:6379":         loopback, // the class, not just "not allowed"
			"169.254.169.254:80":     linkLocal,
			"redis.infra:6379":       allowed, // may resolve into an allowed CIDR
		},
	}, {
		name:  "an explicit CIDR re-allows a default-denied address",
		allow: []string{"127.0.0.1/32", "169.254.10.0/24"},
		want: map[string]string{
			"127.0.0.1:6379":     allowed,
			"127.0.0.2:6379":     loopback,
			"localhost:6379":     allowed,
			"[::1]:6379":         loopback,
			"169.254.10.9:6379":  allowed,
			"169.254.169.254:80": linkLocal,
			"10.0.0.1:6379":      notAllowed,
		},
	}, {
		name:  "a catch-all CIDR is not explicit",
		allow: []string{"0.0.0.0/0", "::/0"},
		want: map[string]string{
			"8.8.8.8:6379":       allowed,
			"[2001:db8::1]:6379": allowed,
			"127.0.0.1:6379":     loopback,
			"169.254.169.254:80": linkLocal,
			"[fd00:ec2::254]:80": linkLocal,
			"100.100.100.200:80": linkLocal,
			"168.63.129.16:80":   linkLocal,
			"[fd20:ce::254]:80":  linkLocal,
			"0.0.0.0:6379":       unspecified,
			"localhost:6379":     loopback,
		},
	}, {
		name:  "host patterns only",
		allow: []string{"redis.infra.svc.cluster.local", "*.Cache.svc.cluster.local."},
		want: map[string]string{
			"redis.infra.svc.cluster.local:6379":  allowed,
			"REDIS.Infra.svc.cluster.local.:6379": allowed,
			"a.cache.svc.cluster.local:6379":      allowed,
			"a.b.cache.svc.cluster.local:6379":    allowed,
			"cache.svc.cluster.local:6379":        notAllowed, // the wildcard needs a label
			"evilcache.svc.cluster.local:6379":    notAllowed,
			"other.infra.svc.cluster.local:6379":  notAllowed,
			"10.0.0.1:6379":                       notAllowed, // an IP literal needs a CIDR
			"169.254.169.254:80":                  linkLocal,
			"localhost:6379":                      loopback,
		},
	}, {
		name:  "host patterns and CIDRs",
		allow: []string{"*.infra.svc.cluster.local", "10.0.0.0/8"},
		want: map[string]string{
			"a.infra.svc.cluster.local:6379": allowed,
			"redis.other:6379":               allowed, // may resolve into 10/8
			"10.0.0.1:6379":                  allowed,
			"192.168.0.1:6379":               notAllowed,
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPolicy(t, tc.allow, tc.deny)
			for ep, want := range tc.want {
				got := verdictOf(t, ep, p.Check(ep))
				switch {
				case want == malformed:
					if got == "" {
						t.Errorf("Check(%q) allowed a malformed endpoint", ep)
					}
				case want == allowed:
					if got != "" {
						t.Errorf("Check(%q) = denied (%s), want allowed", ep, got)
					}
				case !strings.HasPrefix(got, want):
					t.Errorf("Check(%q) reason = %q, want the class %q", ep, got, want)
				}
			}
		})
	}
}

func TestNilPolicyAllowsEverything(t *testing.T) {
	var p *EndpointPolicy
	for _, ep := range []string{"127.0.0.1:6379", "169.254.169.254:80", "localhost:1"} {
		if err := p.Check(ep); err != nil {
			t.Errorf("nil policy: Check(%q) = %v", ep, err)
		}
	}
}

// TestPolicyCheckIP is the dial-time check: the address a name resolved to,
// with or without a matching host pattern.
func TestPolicyCheckIP(t *testing.T) {
	patterns := mustPolicy(t, []string{"*.infra.svc.cluster.local"}, []string{"10.96.0.1"})
	cidrs := mustPolicy(t, []string{"10.0.0.0/8"}, nil)
	open := mustPolicy(t, nil, nil)
	cases := []struct {
		name        string
		p           *EndpointPolicy
		ip          string
		hostMatched bool
		want        string
	}{
		{"pattern-matched name resolving to metadata", patterns, "169.254.169.254", true, classLinkLocal},
		{"pattern-matched name resolving to loopback", patterns, "127.0.0.1", true, classLoopback},
		{"pattern-matched name resolving to the API server", patterns, "10.96.0.1", true, classDenyList},
		{"pattern-matched name resolving to a pod", patterns, "10.1.2.3", true, ""},
		{"unmatched name resolving to a pod", patterns, "10.1.2.3", false, classNotAllowed},
		{"name resolving into an allowed CIDR", cidrs, "10.1.2.3", false, ""},
		{"name resolving outside the allowed CIDRs", cidrs, "192.168.1.1", false, classNotAllowed},
		{"mapped address resolving into an allowed CIDR", cidrs, "::ffff:10.1.2.3", false, ""},
		{"name resolving to mapped loopback", open, "::ffff:127.0.0.1", false, classLoopback},
		{"name resolving to a public address", open, "203.0.113.9", false, ""},
	}
	for _, tc := range cases {
		err := tc.p.checkIP("name:1", netip.MustParseAddr(tc.ip), tc.hostMatched)
		got := verdictOf(t, "name:1", err)
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: checkIP(%s) = %q, want %q", tc.name, tc.ip, got, tc.want)
		}
	}
}

func TestPolicyRejectsBadEntries(t *testing.T) {
	cases := []struct {
		allow, deny []string
		entry       string // the entry the error must name
		valid       string // a phrase of what is valid
	}{
		{allow: []string{"10.0.0.0/8", "10.0.0.0/33"}, entry: `allow[1] "10.0.0.0/33"`, valid: "CIDR such as 10.0.0.0/8"},
		{allow: []string{"::1/129"}, entry: `allow[0] "::1/129"`, valid: "CIDR"},
		{allow: []string{"*"}, entry: `allow[0] "*"`, valid: "*.infra.svc.cluster.local"},
		{allow: []string{"*."}, entry: `allow[0] "*."`, valid: "host name"},
		{allow: []string{"redis.*.svc"}, entry: `allow[0] "redis.*.svc"`, valid: "suffix wildcard"},
		{allow: []string{"redis*"}, entry: `allow[0] "redis*"`, valid: "suffix wildcard"},
		{allow: []string{"**.svc"}, entry: `allow[0] "**.svc"`, valid: "suffix wildcard"},
		{allow: []string{""}, entry: `allow[0] ""`, valid: "host name"},
		{allow: []string{"http://redis"}, entry: `allow[0] "http://redis"`, valid: "CIDR"},
		{allow: []string{"redis host"}, entry: `allow[0] "redis host"`, valid: "host name"},
		{allow: []string{"fe80::1%eth0/64"}, entry: `allow[0] "fe80::1%eth0/64"`, valid: "CIDR"},
		{deny: []string{"10.96.0.1", "kubernetes.default"}, entry: `deny[1] "kubernetes.default"`, valid: "CIDR such as 10.96.0.0/12"},
		{deny: []string{"10.96.0.0/40"}, entry: `deny[0] "10.96.0.0/40"`, valid: "IP address such as 10.96.0.1"},
		{deny: []string{""}, entry: `deny[0] ""`, valid: "IP address"},
	}
	for _, tc := range cases {
		p, err := NewEndpointPolicy(tc.allow, tc.deny)
		if err == nil {
			t.Errorf("NewEndpointPolicy(%q, %q) = %v, want an error", tc.allow, tc.deny, p)
			continue
		}
		if !strings.Contains(err.Error(), tc.entry) || !strings.Contains(err.Error(), tc.valid) {
			t.Errorf("NewEndpointPolicy(%q, %q) error %q: want it to name %s and say %q", tc.allow, tc.deny, err, tc.entry, tc.valid)
		}
	}
}

func TestPolicyAcceptsValidEntries(t *testing.T) {
	mustPolicy(t,
		[]string{"10.0.0.0/8", " 192.168.0.0/16 ", "10.0.0.7", "fd00::/8", "::ffff:10.0.0.0/104", "redis", "redis_1.infra", "*.infra.svc.cluster.local"},
		[]string{"10.96.0.1", "10.96.0.0/12", "fd00:10:96::1", "::ffff:10.244.0.5"})
}
