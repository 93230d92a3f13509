package devcluster

import (
	"path/filepath"
	"testing"
)

// TestWebhookConfiguration keeps config/webhook/manifests.yaml usable by the
// local cluster: it parses strictly and every webhook is pointed at the URL.
func TestWebhookConfiguration(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:1234/mutate-batch-v1-job"
	wh, err := WebhookConfiguration(filepath.Join(root, "config", "webhook", "manifests.yaml"), url, []byte("ca"))
	if err != nil {
		t.Fatal(err)
	}
	if wh.Name != WebhookConfigurationName {
		t.Errorf("name = %q, want %q", wh.Name, WebhookConfigurationName)
	}
	names := map[string]bool{}
	for _, w := range wh.Webhooks {
		names[w.Name] = true
		if w.ClientConfig.Service != nil || w.ClientConfig.URL == nil || *w.ClientConfig.URL != url || string(w.ClientConfig.CABundle) != "ca" {
			t.Errorf("webhook %s: clientConfig = %+v", w.Name, w.ClientConfig)
		}
		if len(w.MatchConditions) == 0 || w.NamespaceSelector == nil {
			t.Errorf("webhook %s lost its matchConditions or namespaceSelector", w.Name)
		}
	}
	for _, want := range []string{"gate.jobs.lockwarden.io", "cronjob-jobs.lockwarden.io"} {
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
