package devcluster

import (
	"path/filepath"
	"testing"

	"github.com/lockwarden/lockwarden/internal/webhook"
)

// TestWebhookConfiguration keeps config/webhook/manifests.yaml usable by the
// local cluster: it parses strictly and every webhook is pointed at the URL.
func TestWebhookConfiguration(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := "https://127.0.0.1:1234"
	wh, err := WebhookConfiguration(filepath.Join(root, "config", "webhook", "manifests.yaml"), base, []byte("ca"))
	if err != nil {
		t.Fatal(err)
	}
	if wh.Name != WebhookConfigurationName {
		t.Errorf("name = %q, want %q", wh.Name, WebhookConfigurationName)
	}
	paths := map[string]string{
		"gate.jobs.lockwarden.io":           "/mutate-batch-v1-job",
		"cronjob-jobs.lockwarden.io":        "/mutate-batch-v1-job",
		"force-release.locks.lockwarden.io": webhook.ForceReleasePath,
		"gate.pods.lockwarden.io":           "/mutate--v1-pod",
		"workloads.lockwarden.io":           webhook.WorkloadPath,
		"spec.locks.lockwarden.io":          webhook.LockSpecPath,
	}
	names := map[string]bool{}
	for _, w := range wh.Webhooks {
		names[w.Name] = true
		if w.ClientConfig.Service != nil || w.ClientConfig.URL == nil || *w.ClientConfig.URL != base+paths[w.Name] || string(w.ClientConfig.CABundle) != "ca" {
			t.Errorf("webhook %s: clientConfig = %+v", w.Name, w.ClientConfig)
		}
		if len(w.MatchConditions) == 0 || w.NamespaceSelector == nil {
			t.Errorf("webhook %s lost its matchConditions or namespaceSelector", w.Name)
		}
	}
	for want := range paths {
		if !names[want] {
			t.Errorf("webhook %s missing; have %v", want, names)
		}
	}
}

func TestWriteKwokStagesNeedsStages(t *testing.T) {
	if _, err := writeKwokStages(t.TempDir(), filepath.Join(t.TempDir(), "stages.yaml")); err == nil {
		t.Fatal("writeKwokStages succeeded without Stage files")
	}
}
