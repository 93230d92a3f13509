package devcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Scheme returns a scheme with client-go's kinds and lockwarden's API.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(locksv1alpha1.AddToScheme(s))
	return s
}

// installObjects installs what the operator needs before it starts, but for
// the webhook configuration (see applyWebhookConfiguration): the CRDs, its
// namespace, and config/default's RBAC and admission policy.
func (c *Cluster) installObjects(ctx context.Context) error {
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{
		Paths:              []string{filepath.Join(c.Root, "config", "crd", "bases")},
		ErrorIfPathMissing: true,
		MaxTime:            startTimeout,
		PollInterval:       100 * time.Millisecond,
	}); err != nil {
		return fmt.Errorf("install CRDs from config/crd/bases: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", OperatorNamespace, err)
	}
	return c.installProductionObjects(ctx)
}

// applyWebhookConfiguration creates the webhook configuration, or updates it,
// so that it points at c.WebhookURL: the operator's port, which changes when
// the one first chosen was taken by another process.
func (c *Cluster) applyWebhookConfiguration(ctx context.Context) error {
	wh, err := WebhookConfiguration(filepath.Join(c.Root, "config", "webhook", "manifests.yaml"), c.WebhookURL, c.pki.caPEM)
	if err != nil {
		return err
	}
	var cur admissionregistrationv1.MutatingWebhookConfiguration
	err = c.Client.Get(ctx, types.NamespacedName{Name: wh.Name}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		err = c.Client.Create(ctx, wh)
	case err == nil:
		cur.Webhooks = wh.Webhooks
		err = c.Client.Update(ctx, &cur)
	}
	if err != nil {
		return fmt.Errorf("apply MutatingWebhookConfiguration %s: %w", wh.Name, err)
	}
	return nil
}

// WebhookConfiguration reads the MutatingWebhookConfiguration in path
// (config/webhook/manifests.yaml) and points every webhook at its service
// path on base (https://host:port), trusting caPEM.
func WebhookConfiguration(path, base string, caPEM []byte) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var wh admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(data, &wh); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if wh.Kind != "MutatingWebhookConfiguration" || len(wh.Webhooks) == 0 {
		return nil, fmt.Errorf("%s holds no MutatingWebhookConfiguration with webhooks", path)
	}
	wh.Name = WebhookConfigurationName
	for i := range wh.Webhooks {
		svc := wh.Webhooks[i].ClientConfig.Service
		if svc == nil || svc.Path == nil {
			return nil, fmt.Errorf("%s: webhook %s names no service path", path, wh.Webhooks[i].Name)
		}
		url := base + *svc.Path
		wh.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	}
	return &wh, nil
}

// podStopStage is a kwok Stage that does what a kubelet does to a deleted
// Pod whose finalizers keep it: at the end of its grace period (its
// deletionTimestamp) its containers are killed, terminated (exit code 143:
// SIGTERM), and the Pod turns Failed. kwok's own Stages leave such a Pod
// Running until its finalizers are gone, so a finalizer that waits for the
// Pod to stop (lockwarden's on gated Pods) would wait forever.
const podStopStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-stop-on-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
  weight: 1
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.deletionTimestamp'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: ContainersReady
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 143
            finishedAt: {{ $now | Quote }}
            reason: Error
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Failed
`

// writeKwokStages concatenates the kwok Stages the cluster uses (node/fast,
// pod/general, from the kwok module's kustomize/stage, and podStopStage)
// into one file.
func writeKwokStages(assets, out string) (string, error) {
	var buf bytes.Buffer
	for _, dir := range []string{"node/fast", "pod/general"} {
		files, err := filepath.Glob(filepath.Join(assets, "kwok-stages", dir, "*.yaml"))
		if err != nil {
			return "", err
		}
		files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "kustomization.yaml" })
		if len(files) == 0 {
			return "", fmt.Errorf("no kwok Stage files in %s", filepath.Join(assets, "kwok-stages", dir))
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return "", err
			}
			buf.WriteString("---\n# " + dir + "/" + filepath.Base(f) + "\n")
			buf.Write(data)
			if !bytes.HasSuffix(data, []byte("\n")) {
				buf.WriteByte('\n')
			}
		}
	}
	buf.WriteString("---\n# devcluster: pod-stop-on-delete\n" + podStopStage)
	return out, os.WriteFile(out, buf.Bytes(), 0o600)
}

// createNode registers the node kwok simulates. It carries no taint, so Pods
// need no toleration; it is labelled type=kwok for nodeSelectors.
func createNode(ctx context.Context, c client.Client) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: NodeName,
			Annotations: map[string]string{
				"kwok.x-k8s.io/node":           "fake",
				"node.alpha.kubernetes.io/ttl": "0",
			},
			Labels: map[string]string{
				"type":                   "kwok",
				"kubernetes.io/hostname": NodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", NodeName, err)
	}
	return nil
}

func nodeReady(ctx context.Context, c client.Client) (bool, error) {
	var node corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: NodeName}, &node); err != nil {
		return false, err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

func defaultServiceAccountExists(ctx context.Context, c client.Client) (bool, error) {
	var sa corev1.ServiceAccount
	err := c.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "default"}, &sa)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}
