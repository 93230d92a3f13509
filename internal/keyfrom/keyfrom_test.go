package keyfrom

import (
	"strings"
	"testing"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestCompileRefusesWhatCannotGiveAKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		kf   locksv1alpha1.KeyFrom
		want string
	}{
		{"syntax", locksv1alpha1.KeyFrom{Expression: `"deploy/" + `}, "spec.keyFrom.expression"},
		{"unknown variable", locksv1alpha1.KeyFrom{Expression: `job.metadata.name`}, "undeclared reference"},
		{"not a string", locksv1alpha1.KeyFrom{Expression: `1 + 2`}, "want a string"},
		{"guard not a bool", locksv1alpha1.KeyFrom{Expression: `owner.name`, Matches: `owner.kind`}, "spec.keyFrom.matches"},
		{"too costly", locksv1alpha1.KeyFrom{Expression: `object.metadata.labels.map(k, object.metadata.annotations.map(a, k + a).join(",")).join(",")`}, "more than the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(&tc.kf)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile(%+v) = %v, want an error with %q", tc.kf, err, tc.want)
			}
		})
	}
}

func TestKey(t *testing.T) {
	p, err := Compile(&locksv1alpha1.KeyFrom{
		Expression: `"deploy/" + object.metadata.labels["env"]`,
		Matches:    `!("skip" in object.metadata.labels)`,
	})
	if err != nil {
		t.Fatal(err)
	}
	w := Workload{Namespace: "ci", Name: "run-1", Labels: map[string]string{"env": "prod"}, OwnerKind: "CronJob", OwnerName: "deploy"}
	if k, err := p.Key("deploys", w); err != nil || k != "deploy/prod" {
		t.Fatalf("Key = %q, %v; want deploy/prod", k, err)
	}
	w.Labels = map[string]string{"team": "a"}
	_, err = p.Key("deploys", w)
	for _, want := range []string{"lock deploys", `"deploy/" + object.metadata.labels["env"]`, "no such key: env", "labels: team"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a workload without the label: %v, want an error with %q", err, want)
		}
	}
	w.Labels = map[string]string{"env": "prod", "skip": "yes"}
	if _, err := p.Key("deploys", w); err == nil || !strings.Contains(err.Error(), "matches") {
		t.Fatalf("a workload the guard refuses: %v", err)
	}
	q, err := Compile(&locksv1alpha1.KeyFrom{Expression: `object.metadata.annotations["target"]`})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a b", "../x", strings.Repeat("k", 201)} {
		if k, err := q.Key("l", Workload{Annotations: map[string]string{"target": bad}}); err == nil {
			t.Fatalf("the value %q gave the key %q, want a refusal", bad, k)
		}
	}
	r, err := Compile(&locksv1alpha1.KeyFrom{Expression: `owner.kind + "/" + owner.name + "/" + object.metadata.namespace`})
	if err != nil {
		t.Fatal(err)
	}
	if k, err := r.Key("l", Workload{Namespace: "ci", OwnerKind: "CronJob", OwnerName: "nightly"}); err != nil || k != "CronJob/nightly/ci" {
		t.Fatalf("Key = %q, %v", k, err)
	}
}
