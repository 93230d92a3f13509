// Command lockwarden is the lockwarden manager: it runs the DistributedLock
// and Job controllers and the admission webhook (see internal/manager).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	_ "time/tzdata" // the time zones of spec.holds[].timeZone, also in an image without /usr/share/zoneinfo

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lockwarden/lockwarden/internal/manager"
)

func main() {
	o, err := manager.ParseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(o.ZapOptions())))
	if _, err := manager.SetMemoryLimit(ctrl.Log.WithName("memlimit")); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Cannot set the Go memory limit from the container's; running without one")
	}
	cfg, err := manager.RestConfig(o.Kubeconfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden: no Kubernetes configuration (in-cluster, --kubeconfig or $KUBECONFIG):", err)
		os.Exit(1)
	}
	if err := manager.Run(ctrl.SetupSignalHandler(), cfg, o); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Manager stopped")
		os.Exit(1)
	}
}
