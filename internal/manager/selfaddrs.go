package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/netguard"
)

// +kubebuilder:rbac:groups="",resources=endpoints,resourceNames=kubernetes,verbs=get

// endpointPolicy builds the policy endpoints chosen in a namespace are
// checked against: the flags, plus the addresses of the cluster itself that
// no tenant may aim the operator at (selfAddresses). Those change while the
// operator runs, so a runnable of mgr reads them again every
// --endpoint-deny-refresh, on every replica (the webhook checks endpoints
// too).
func endpointPolicy(ctx context.Context, c client.Reader, mgr ctrl.Manager, o *Options, log logr.Logger) (*netguard.EndpointPolicy, error) {
	p, err := netguard.NewEndpointPolicy(o.allowList(), o.endpointDeny)
	if err != nil {
		return nil, err
	}
	learn := func(ctx context.Context, verbose bool) {
		addrs, err := selfAddresses(ctx, c, mgr.GetConfig(), o.namespace)
		if err != nil {
			log.Info("Could not read all of the cluster's own addresses; the ones read are denied, and those of the last read stay denied", "error", err.Error())
			if len(addrs) == 0 {
				return
			}
			addrs = append(addrs, p.Learned()...)
		}
		var denied []string
		for _, ip := range addrs {
			// An address the administrator allowed by name (a local cluster
			// whose API server and Redis share 127.0.0.1, say) stays allowed;
			// --endpoint-deny entries are never lifted.
			if allowedExactly(o.endpointAllow, ip) {
				if verbose {
					log.Info("The API server's or the manager's own address is allowed by --endpoint-allow; endpoints chosen in a namespace may reach it", "address", ip)
				}
				continue
			}
			denied = append(denied, ip)
		}
		before := p.Learned()
		p.SetLearned(denied)
		if after := p.Learned(); verbose || !slices.Equal(before, after) {
			log.V(1).Info("Denied addresses of the cluster itself", "addresses", after)
		}
	}
	learn(ctx, true)
	if o.inlineEndpoints && len(o.endpointAllow) == 0 {
		log.Info("No --endpoint-allow: endpoints chosen in a namespace (inline, or in a LockBackend) are refused; locks must name a ClusterLockBackend")
	}
	if err := mgr.Add(everyReplica(func(ctx context.Context) error {
		wait.UntilWithContext(ctx, func(ctx context.Context) { learn(ctx, false) }, o.denyRefresh)
		return nil
	})); err != nil {
		return nil, fmt.Errorf("add the refresh of the denied addresses: %w", err)
	}
	return p, nil
}

// everyReplica is a runnable that runs on every replica, leader or not.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }

// selfAddresses returns the addresses of the cluster itself that no tenant
// may aim the operator at: the API server's (the host the manager talks to,
// the kubernetes Service and its endpoints), the manager's own pod IP, and,
// in the operator's namespace, every Service's cluster IPs and every
// address behind them (the other replicas, the webhook, metrics); the Role
// self-addresses-role (config/rbac) lets it list those. On an error it
// returns what it could read, and the error.
func selfAddresses(ctx context.Context, c client.Reader, cfg *rest.Config, namespace string) ([]string, error) {
	var out []string
	var errs []error
	if u, err := url.Parse(cfg.Host); err == nil && u.Hostname() != "" {
		out = append(out, lookupIPs(ctx, u.Hostname())...)
	}
	for _, env := range []string{"KUBERNETES_SERVICE_HOST", "POD_IP"} {
		if v := os.Getenv(env); v != "" {
			out = append(out, lookupIPs(ctx, v)...)
		}
	}
	var ep corev1.Endpoints //nolint:staticcheck // SA1019: one named object; EndpointSlices would need list rights in the default namespace
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "kubernetes"}, &ep); err != nil {
		errs = append(errs, fmt.Errorf("the API server's endpoints (default/kubernetes; deny them with --endpoint-deny): %w", err))
	} else {
		for _, ss := range ep.Subsets {
			for _, a := range ss.Addresses {
				out = append(out, a.IP)
			}
		}
	}
	var services corev1.ServiceList
	if err := c.List(ctx, &services, client.InNamespace(namespace)); err != nil {
		errs = append(errs, fmt.Errorf("the Services of namespace %s: %w", namespace, err))
	}
	for _, s := range services.Items {
		out = append(out, s.Spec.ClusterIPs...)
		out = append(out, s.Spec.ExternalIPs...)
	}
	var eps discoveryv1.EndpointSliceList
	if err := c.List(ctx, &eps, client.InNamespace(namespace)); err != nil {
		errs = append(errs, fmt.Errorf("the EndpointSlices of namespace %s: %w", namespace, err))
	}
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			out = append(out, e.Addresses...)
		}
	}
	return out, errors.Join(errs...)
}

// allowedExactly reports whether an allow entry names exactly ip: the IP
// itself or a single-address CIDR (127.0.0.1/32). A wider CIDR (the pod
// network, say) does not lift the denial of the API server's addresses.
func allowedExactly(allow []string, ip string) bool {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	addr = addr.Unmap()
	for _, a := range allow {
		if p, err := netip.ParsePrefix(a); err == nil && p.IsSingleIP() && p.Addr().Unmap() == addr {
			return true
		}
		if b, err := netip.ParseAddr(a); err == nil && b.Unmap() == addr {
			return true
		}
	}
	return false
}

// lookupIPs returns host's addresses (host itself when it is one); none when it does not resolve.
func lookupIPs(ctx context.Context, host string) []string {
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return nil
	}
	return addrs
}
