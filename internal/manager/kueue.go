package manager

import (
	"flag"
	"fmt"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
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

// resolveKueue decides, once, whether the Kueue admission check runs: with
// auto, when the API server serves Kueue's Workloads.
func (o *Options) resolveKueue(mgr ctrl.Manager) error {
	switch o.kueueAdmissionCheck {
	case kueueOff:
		o.kueue = false
	case kueueOn:
		o.kueue = true
	default:
		_, err := mgr.GetRESTMapper().RESTMapping(kueue.GroupVersion.WithKind("Workload").GroupKind(), kueue.GroupVersion.Version)
		switch {
		case err == nil:
			o.kueue = true
		case apimeta.IsNoMatchError(err):
			o.kueue = false
		default:
			return fmt.Errorf("--kueue-admission-check=auto: find out whether the API server serves Kueue's Workloads: %w", err)
		}
	}
	ctrl.Log.WithName("setup").Info("Kueue admission check", "enabled", o.kueue, "flag", o.kueueAdmissionCheck)
	return nil
}
