package hostile

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// The addresses of the operator's own namespace change while it runs: a
// replica is rescheduled or added, a Service is created. A tenant's endpoint
// must be refused on those addresses as soon as the operator can see them
// (with the RBAC it is installed with), even inside an allowed CIDR, and
// allowed again once nothing of the operator's is there any more.
func TestOperatorAddressesAreDeniedAsTheyChange(t *testing.T) {
	ctx := context.Background()
	ns := tenantNamespace(t, nil)
	reason := func(dl *locksv1alpha1.DistributedLock) (string, string) {
		c, _ := condition(t, client.ObjectKeyFromObject(dl), locksv1alpha1.ConditionBackendReady)
		if c == nil {
			return "", "no BackendReady condition"
		}
		return c.Reason, c.Message
	}
	const ownAddress = "API server or operator address"
	waitDenied := func(dl *locksv1alpha1.DistributedLock, what string) {
		t.Helper()
		eventually(t, 2*denyRefresh+2*resync+5*time.Second, dl.Name+" refused: "+what, func() (bool, string) {
			r, msg := reason(dl)
			return r == locksv1alpha1.ReasonBackendNotAllowed && strings.Contains(msg, ownAddress), r + ": " + msg
		})
	}
	waitTried := func(dl *locksv1alpha1.DistributedLock, what string) {
		t.Helper()
		eventually(t, 2*denyRefresh+2*resync+5*time.Second, dl.Name+" tried: "+what, func() (bool, string) {
			r, msg := reason(dl)
			return r == locksv1alpha1.ReasonBackendUnreachable, r + ": " + msg
		})
	}

	// A new replica's pod IP, inside the allowed CIDR: not the operator's yet.
	peer := inlineLock(ns, "peer", "10.77.0.9:6379")
	create(t, asTenant, peer)
	waitTried(peer, "an allowed address nothing answers on")
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-webhook-service-x1", Namespace: tenancytest.OperatorNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: "lockwarden-webhook-service"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.77.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	create(t, env.Client, slice)
	waitDenied(peer, "the address of a pod behind one of the operator's Services")

	// A Service of the operator's namespace, created after the start.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-metrics-service", Namespace: tenancytest.OperatorNamespace},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8443}}},
	}
	create(t, env.Client, svc)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, svc) })
	if !strings.HasPrefix(svc.Spec.ClusterIP, "10.") {
		t.Fatalf("the Service got cluster IP %q; the test needs one in the allowed 10.0.0.0/8", svc.Spec.ClusterIP)
	}
	service := inlineLock(ns, "service", svc.Spec.ClusterIP+":8443")
	create(t, asTenant, service)
	waitDenied(service, "the cluster IP of one of the operator's Services")

	// The pod moved away: its old address is an address like any other.
	if err := env.Client.Delete(ctx, slice); err != nil {
		t.Fatal(err)
	}
	waitTried(peer, "the address is no longer the operator's")
}
