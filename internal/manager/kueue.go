package manager

import (
	"flag"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/lockwarden/lockwarden/controllers"
)

// Values of --kueue-admission-check.
const (
	kueueAuto = "auto"
	kueueOn   = "true"
	kueueOff  = "false"
)

func bindKueueFlag(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.kueueAdmissionCheck, "kueue-admission-check", kueueAuto,
		"Run as the controller of Kueue AdmissionChecks with controllerName lockwarden.io/lock, and leave the Jobs Kueue queues (label kueue.x-k8s.io/queue-name) to Kueue instead of suspending them: "+
			"auto (default) when the API server serves Kueue's Workloads (kueue.x-k8s.io/v1beta2) as the manager starts (install Kueue first, or restart the manager after), true always (the manager fails to start without Kueue), false never.")
}

func (o *Options) checkKueueFlag() error {
	switch o.kueueAdmissionCheck {
	case kueueAuto, kueueOn, kueueOff:
		return nil
	}
	return fmt.Errorf("--kueue-admission-check %q must be %q, %q or %q", o.kueueAdmissionCheck, kueueAuto, kueueOn, kueueOff)
}

// resolveKueue decides, once, before the manager is built, whether the
// Kueue admission check runs: with auto, when the API server serves
// Kueue's Workloads. (The manager's cache must not be told about Workloads
// otherwise: it fails to start for a kind the API server does not serve.)
func (o *Options) resolveKueue(cfg *rest.Config) error {
	switch o.kueueAdmissionCheck {
	case kueueOff:
		o.kueue = false
	case kueueOn:
		o.kueue = true
	default:
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return fmt.Errorf("--kueue-admission-check=auto: %w", err)
		}
		resources, err := dc.ServerResourcesForGroupVersion(kueue.GroupVersion.String())
		switch {
		case apierrors.IsNotFound(err):
			o.kueue = false
		case err != nil:
			return fmt.Errorf("--kueue-admission-check=auto: find out whether the API server serves Kueue's Workloads: %w", err)
		default:
			o.kueue = false
			for _, r := range resources.APIResources {
				if r.Name == "workloads" {
					o.kueue = true
				}
			}
		}
	}
	ctrl.Log.WithName("setup").Info("Kueue admission check", "enabled", o.kueue, "flag", o.kueueAdmissionCheck)
	return nil
}

// kueueCache adds to byObject how the manager caches Workloads when the
// admission check runs: without their pod templates.
func (o *Options) kueueCache(byObject map[client.Object]cache.ByObject) map[client.Object]cache.ByObject {
	if o.kueue {
		byObject[&kueue.Workload{}] = cache.ByObject{Transform: controllers.LeanWorkload}
	}
	return byObject
}
