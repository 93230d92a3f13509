package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// The files this package checks, relative to the module root.
const (
	dashboardPath = "config/grafana/lockwarden-dashboard.json"
	rulesGlob     = "config/prometheus/*.yaml"
)

// query is one PromQL expression and where it comes from, for messages.
type query struct {
	where string
	expr  string
}

// dashboard is the part of a Grafana dashboard these tests read.
type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID          int              `json:"id"`
	Type        string           `json:"type"`
	Title       string           `json:"title"`
	Datasource  *panelDatasource `json:"datasource"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID      string           `json:"refId"`
		Expr       string           `json:"expr"`
		Datasource *panelDatasource `json:"datasource"`
	} `json:"targets"`
	// Panels are a collapsed row's panels.
	Panels []panel `json:"panels"`
}

type panelDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// rule is one rule of a PrometheusRule.
type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type prometheusRule struct {
	Kind string `json:"kind"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// readDashboard parses the Grafana dashboard.
func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b := readModuleFile(t, dashboardPath)
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows: the dashboard's panels and those of collapsed rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// readRules parses every PrometheusRule in config/prometheus.
func readRules(t *testing.T) map[string][]rule {
	t.Helper()
	root, err := kubetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, rulesGlob))
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string][]rule{}
	for _, f := range files {
		objs, err := kubetest.ReadManifests(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() != "PrometheusRule" {
				continue
			}
			b, err := json.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			var pr prometheusRule
			if err := json.Unmarshal(b, &pr); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			rel, _ := filepath.Rel(root, f)
			for _, g := range pr.Spec.Groups {
				rules[rel] = append(rules[rel], g.Rules...)
			}
		}
	}
	if len(rules) == 0 {
		t.Fatalf("no PrometheusRule in %s", rulesGlob)
	}
	return rules
}

// queries returns every PromQL expression of the alerts and of the
// dashboard's panel targets.
func queries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for file, rules := range readRules(t) {
		for _, r := range rules {
			qs = append(qs, query{where: fmt.Sprintf("%s: %s%s", file, r.Alert, r.Record), expr: r.Expr})
		}
	}
	for _, p := range allPanels(readDashboard(t).Panels) {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: fmt.Sprintf("%s: panel %q target %s", dashboardPath, p.Title, tg.RefID), expr: tg.Expr})
		}
	}
	return qs
}

func readModuleFile(t *testing.T, rel string) []byte {
	t.Helper()
	root, err := kubetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDashboardPanels: the dashboard imports into Grafana with a data source
// chosen by the user: every panel (rows aside) queries ${datasource} with
// at least one non-empty expression and says its unit, and the namespace and
// lock variables exist.
func TestDashboardPanels(t *testing.T) {
	d := readDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want 36 or later (Grafana 9+ data source references)", d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "namespace": "query", "lock": "query"} {
		if vars[name] != typ {
			t.Errorf("templating variable %q has type %q, want %q", name, vars[name], typ)
		}
	}
	ids := map[int]string{}
	panels := allPanels(d.Panels)
	if len(panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range panels {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q has no unit", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s has no expression", p.Title, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s: datasource %+v, want uid ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
}

// TestAlertsTellOnCallWhatToDo: every alert has a severity on-call routes by
// (critical or warning), a summary, a description and a runbook link into
// docs/monitoring.md whose section exists.
func TestAlertsTellOnCallWhatToDo(t *testing.T) {
	doc := strings.ToLower(string(readModuleFile(t, "docs/monitoring.md")))
	n := 0
	for file, rules := range readRules(t) {
		for _, r := range rules {
			if r.Alert == "" {
				continue
			}
			n++
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: alert %s has severity %q, want critical or warning", file, r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: alert %s has no %s annotation", file, r.Alert, a)
				}
			}
			anchor := strings.ToLower(r.Alert)
			if !strings.HasSuffix(r.Annotations["runbook_url"], "docs/monitoring.md#"+anchor) {
				t.Errorf("%s: alert %s: runbook_url %q, want it to end in docs/monitoring.md#%s", file, r.Alert, r.Annotations["runbook_url"], anchor)
			}
			if !strings.Contains(doc, "\n### "+anchor+"\n") {
				t.Errorf("docs/monitoring.md has no runbook section \"### %s\" (the alert is in %s)", r.Alert, file)
			}
			if len(metricNames(r.Expr)) == 0 {
				t.Errorf("%s: alert %s: no metric found in %q", file, r.Alert, r.Expr)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts found")
	}
}
