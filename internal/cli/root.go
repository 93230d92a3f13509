// Package cli is the kubectl plugin kubectl-lockwarden: the operator's view
// of DistributedLocks and their gated Jobs and Pods (status, queue, why), manual holds
// (hold, unhold) and the audited force release (release --force).
//
// The connection flags (--kubeconfig, --context, -n/--namespace and the rest
// of kubectl's) come from k8s.io/cli-runtime's ConfigFlags, and -o json|yaml
// from its PrintFlags, so they behave as in kubectl. NewCommand builds the
// whole command tree on given streams, so that tests run it in-process.
package cli

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

// FieldManager is the field manager of every change the plugin makes, so
// that managedFields show which fields it set.
const FieldManager = "kubectl-lockwarden"

// Version is the plugin's release, set at build time with
// -ldflags "-X github.com/lockwarden/lockwarden/internal/cli.Version=v0.1.0".
// When unset, the module version Go recorded in the binary is shown.
var Version = ""

// scheme knows the built-in kinds and lockwarden's API.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(locksv1alpha1.AddToScheme(s))
	return s
}()

// options is what every subcommand shares: the streams and the connection flags.
type options struct {
	genericiooptions.IOStreams
	config *genericclioptions.ConfigFlags
}

// NewCommand returns the kubectl-lockwarden command tree writing to streams.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	config := genericclioptions.NewConfigFlags(true)
	// --as names a manual holder (hold --as NAME); kubectl's impersonation
	// flags are left out so that --as means one thing only. Use a kubeconfig
	// context of the other user to act as them.
	config.Impersonate = nil
	config.ImpersonateUID = nil
	config.ImpersonateGroup = nil
	config.ImpersonateUserExtra = nil
	o := &options{IOStreams: streams, config: config}

	root := &cobra.Command{
		Use:   "kubectl-lockwarden",
		Short: "Inspect and operate lockwarden's DistributedLocks",
		Long: `kubectl lockwarden shows lockwarden's DistributedLocks as the operator sees them
(who holds a lock, with which fencing token, who waits, why a Job is
suspended or a Pod is gated; for a lock with spec.keyFrom, one derived key
with --key), holds a lock for a manual holder, and asks the operator for an
audited force release.

The connection flags (--kubeconfig, --context, -n/--namespace, ...) work as in
kubectl. kubectl's impersonation flags are not offered: --as names a manual
holder (see "hold").`,
		Example: `  kubectl lockwarden status -A
  kubectl lockwarden queue billing -n team-a
  kubectl lockwarden why nightly-report-29120 -n team-a
  kubectl lockwarden why pod/payments-7d9f8b6c5d-x2k9q -n team-a
  kubectl lockwarden why deploys --key deploy/prod -n team-a
  kubectl lockwarden hold billing --as maintenance-2026-12-01 --wait --timeout 2h
  kubectl lockwarden release billing --force`,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl lockwarden",
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	config.AddFlags(root.PersistentFlags())

	root.AddCommand(
		newStatusCommand(o),
		newQueueCommand(o),
		newWhyCommand(o),
		newHoldCommand(o),
		newUnholdCommand(o),
		newReleaseCommand(o),
		newVersionCommand(o),
	)
	return root
}

// Execute runs the command tree with args and writes an error, if any, to
// streams.ErrOut as "error: ...", as kubectl does.
func Execute(ctx context.Context, streams genericiooptions.IOStreams, args []string) error {
	cmd := NewCommand(streams)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err != nil {
		// Errors may quote status, which comes partly from the backend.
		fmt.Fprintln(streams.ErrOut, "error:", printable.String(err.Error()))
	}
	return err
}

// client returns a direct client and the namespace that -n, or else the
// kubeconfig context, selects.
func (o *options) client() (client.Client, string, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to the API server at %s: %w", cfg.Host, err)
	}
	return c, ns, nil
}

// getLock reads a DistributedLock; a missing one is reported with the names
// of the locks that do exist in the namespace.
func getLock(ctx context.Context, c client.Client, ns, name string) (*locksv1alpha1.DistributedLock, error) {
	var dl locksv1alpha1.DistributedLock
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dl)
	if err == nil {
		return &dl, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get lock %q in namespace %q: %w", name, ns, err)
	}
	msg := fmt.Sprintf("lock %q not found in namespace %q", name, ns)
	var list locksv1alpha1.DistributedLockList
	if c.List(ctx, &list, client.InNamespace(ns)) == nil {
		names := make([]string, 0, len(list.Items))
		for _, l := range list.Items {
			names = append(names, l.Name)
		}
		slices.Sort(names)
		if len(names) == 0 {
			msg += " (it has no DistributedLocks; pick another with -n or --context)"
		} else {
			msg += fmt.Sprintf(" (its locks: %s)", strings.Join(names, ", "))
		}
	}
	return nil, fmt.Errorf("%s", msg)
}

// version is the plugin's version: Version, or the module version Go recorded.
func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func newVersionCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the plugin's version",
		Example: `  kubectl lockwarden version`,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			goVersion := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
			}
			_, err := fmt.Fprintf(o.Out, "kubectl-lockwarden %s (API %s, %s)\n", version(), locksv1alpha1.GroupVersion, goVersion)
			return err
		},
	}
}
