package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// chartDir is the chart, relative to the module root.
const chartDir = "charts/lockwarden"

// The release the chart is rendered as, for the lint, render and dry-run
// tests: a release name without "lockwarden" in it, so that every object name
// carries the "<release>-lockwarden-" prefix and a name the templates forgot to
// derive from the release shows up as a mismatch.
const (
	releaseName      = "ops"
	releaseNamespace = "lockwarden-chart"
	releasePrefix    = "ops-lockwarden-"
)

// valueSet is one way to install the chart: the --set flags of helm.
type valueSet struct {
	// set are the values given with --set; an entry that starts with "--"
	// is a whole flag, such as --set-json=....
	set []string
	// check asserts what the switch changes in the rendered objects.
	check func(t *testing.T, objs []*unstructured.Unstructured)
}

// valueSets are the chart's defaults and each of its non-default switches.
var valueSets = map[string]valueSet{
	"no lock-lease policy": {
		set: []string{"lockLeasePolicy.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if strings.HasSuffix(o.GetName(), "-lock-leases") {
					t.Errorf("%s rendered with lockLeasePolicy.enabled=false", objectKey(o))
				}
			}
			find(t, objs, "ValidatingAdmissionPolicy", releasePrefix+"job-gate")
		},
	},
	"no default backend": {
		set: []string{"defaultClusterLockBackend="},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			args := managerArgs(t, find(t, objs, "Deployment", releasePrefix+"controller-manager"))
			if !slices.Contains(args, "--default-cluster-lock-backend=") {
				t.Errorf("manager args %q lack --default-cluster-lock-backend= (create none)", args)
			}
		},
	},
	"defaults": {
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			dep := find(t, objs, "Deployment", releasePrefix+"controller-manager")
			// Numbers decode as float64 or int64 depending on the decoder.
			if r, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); fmt.Sprint(r) != "2" {
				t.Errorf("Deployment replicas = %v, want 2 (leader election on)", r)
			}
			args := managerArgs(t, dep)
			for _, want := range []string{
				"--leader-elect",
				"--metrics-bind-address=:8443",
				"--webhook-service=" + releaseNamespace + "/" + releasePrefix + "webhook-service",
				"--webhook-configuration=" + releasePrefix + "mutating-webhook-configuration",
			} {
				if !slices.Contains(args, want) {
					t.Errorf("manager args %q lack %s", args, want)
				}
			}
			find(t, objs, "ValidatingAdmissionPolicy", releasePrefix+"lock-leases")
			find(t, objs, "ValidatingAdmissionPolicyBinding", releasePrefix+"lock-leases")
			// The manager's own default creates the ClusterLockBackend
			// "kubernetes": a default install gates with no store to run.
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--default-cluster-lock-backend") }) {
				t.Errorf("manager args %q change --default-cluster-lock-backend by default", args)
			}
			img := managerContainer(t, dep)["image"]
			if img != "ghcr.io/lockwarden/lockwarden:v0.1.0" {
				t.Errorf("manager image = %v, want ghcr.io/lockwarden/lockwarden:v0.1.0 (v + appVersion)", img)
			}
			// The built-in certificate's Secret, whose name the manager's code fixes.
			find(t, objs, "Secret", "lockwarden-webhook-server-cert")
			for _, kind := range []string{"Certificate", "Issuer", "ServiceMonitor", "ResourceQuota"} {
				if n := count(objs, kind); n != 0 {
					t.Errorf("defaults render %d %s objects, want none", n, kind)
				}
			}
			// What may reach the manager's pods, and only that: the
			// webhook, metrics from the labelled namespaces, the probes.
			if n := count(objs, "NetworkPolicy"); n != 1 {
				t.Errorf("defaults render %d NetworkPolicies, want the ingress one only", n)
			}
			in := find(t, objs, "NetworkPolicy", releasePrefix+"manager-ingress")
			rules, _, _ := unstructured.NestedSlice(in.Object, "spec", "ingress")
			var ports []string
			for _, r := range rules {
				ps, _, _ := unstructured.NestedSlice(r.(map[string]any), "ports")
				for _, p := range ps {
					ports = append(ports, fmt.Sprint(p.(map[string]any)["port"]))
				}
			}
			if slices.Sort(ports); !slices.Equal(ports, []string{"8081", "8443", "9443"}) {
				t.Errorf("the ingress NetworkPolicy opens ports %v, want the probes', metrics' and webhook's only (8081, 8443, 9443)", ports)
			}
		},
	},
	"no NetworkPolicy": {
		set: []string{"networkPolicy.ingress=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if n := count(objs, "NetworkPolicy"); n != 0 {
				t.Errorf("networkPolicy.ingress=false renders %d NetworkPolicies, want none", n)
			}
		},
	},
	"cert-manager": {
		set: []string{"webhook.certificate.mode=cert-manager"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			cert := find(t, objs, "Certificate", releasePrefix+"serving-cert")
			find(t, objs, "Issuer", releasePrefix+"selfsigned-issuer")
			secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
			mwc := find(t, objs, "MutatingWebhookConfiguration", releasePrefix+"mutating-webhook-configuration")
			want := releaseNamespace + "/" + releasePrefix + "serving-cert"
			if got := mwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != want {
				t.Errorf("webhook configuration annotation cert-manager.io/inject-ca-from = %q, want %q", got, want)
			}
			dep := find(t, objs, "Deployment", releasePrefix+"controller-manager")
			if args := managerArgs(t, dep); !slices.Contains(args, "--webhook-cert-mode=external") {
				t.Errorf("manager args %q lack --webhook-cert-mode=external", args)
			}
			vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
			if len(vols) != 1 {
				t.Fatalf("Deployment volumes = %v, want the webhook-certs volume only", vols)
			}
			got, _, _ := unstructured.NestedString(vols[0].(map[string]any), "secret", "secretName")
			if got != secret || secret == "" {
				t.Errorf("webhook-certs volume mounts Secret %q, want the Certificate's %q", got, secret)
			}
			// The manager neither writes nor may touch the built-in certificate's Secret.
			if n := count(objs, "Secret"); n != 0 {
				t.Errorf("cert-manager mode renders %d Secrets, want none", n)
			}
		},
	},
	"serviceMonitor": {
		set: []string{"serviceMonitor.enabled=true"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			sm := find(t, objs, "ServiceMonitor", releasePrefix+"controller-manager-metrics-monitor")
			eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			if len(eps) != 1 || eps[0].(map[string]any)["port"] != "https" {
				t.Errorf("ServiceMonitor endpoints = %v, want one on the metrics Service's https port", eps)
			}
		},
	},
	"clusterLockBackends": {
		set: []string{`--set-json=clusterLockBackends=[{"name":"shared-redis","spec":{"redis":{"endpoints":["redis-0.lockwarden-system:6379"],"passwordSecretRef":{"name":"shared-redis-auth","key":"password"}},"namespaceSelector":{"matchLabels":{"lockwarden.io/backend-shared-redis":"true"}}}}]`},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			b := find(t, objs, "ClusterLockBackend", "shared-redis")
			eps, _, _ := unstructured.NestedStringSlice(b.Object, "spec", "redis", "endpoints")
			if !slices.Equal(eps, []string{"redis-0.lockwarden-system:6379"}) {
				t.Errorf("ClusterLockBackend shared-redis endpoints = %q, want the value's", eps)
			}
			sel, _, _ := unstructured.NestedStringMap(b.Object, "spec", "namespaceSelector", "matchLabels")
			if sel["lockwarden.io/backend-shared-redis"] != "true" {
				t.Errorf("ClusterLockBackend shared-redis namespaceSelector = %v, want the value's", sel)
			}
		},
	},
	"networkPolicy": {
		set: []string{"networkPolicy.enabled=true", "networkPolicy.apiServerCIDRs={192.0.2.10/32}"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			find(t, objs, "NetworkPolicy", releasePrefix+"manager-ingress")
			eg := find(t, objs, "NetworkPolicy", releasePrefix+"manager-egress")
			if !strings.Contains(toYAML(t, eg), "cidr: 192.0.2.10/32") {
				t.Errorf("egress NetworkPolicy does not allow networkPolicy.apiServerCIDRs:\n%s", toYAML(t, eg))
			}
		},
	},
	"tenantQuota": {
		set: []string{"tenantQuota.namespaces={default,kube-public}"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var namespaces []string
			for _, o := range objs {
				if o.GetKind() != "ResourceQuota" {
					continue
				}
				namespaces = append(namespaces, o.GetNamespace())
				hard, _, _ := unstructured.NestedStringMap(o.Object, "spec", "hard")
				for _, r := range []string{"count/distributedlocks.locks.lockwarden.io", "count/lockbackends.locks.lockwarden.io", "count/jobs.batch", "count/cronjobs.batch", "pods"} {
					if hard[r] == "" {
						t.Errorf("ResourceQuota %s/%s does not bound %s: %v", o.GetNamespace(), o.GetName(), r, hard)
					}
				}
			}
			slices.Sort(namespaces)
			if !slices.Equal(namespaces, []string{"default", "kube-public"}) {
				t.Errorf("ResourceQuotas in %q, want one in each of tenantQuota.namespaces", namespaces)
			}
		},
	},
	"webhook client CA from a Secret": {
		set: []string{"webhook.clientCA.secretName=apiserver-webhook-ca", "webhook.clientNames={kube-apiserver,apiserver.example}"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkClientCA(t, objs, "secret", "secretName", "apiserver-webhook-ca", "ca.crt")
			dep := find(t, objs, "Deployment", releasePrefix+"controller-manager")
			if args := managerArgs(t, dep); !slices.Contains(args, "--webhook-client-name=kube-apiserver,apiserver.example") {
				t.Errorf("manager args %q lack --webhook-client-name=kube-apiserver,apiserver.example", args)
			}
		},
	},
	"webhook client CA from a ConfigMap": {
		set: []string{"webhook.clientCA.configMapName=apiserver-webhook-ca", "webhook.clientCA.key=bundle.pem"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkClientCA(t, objs, "configMap", "name", "apiserver-webhook-ca", "bundle.pem")
		},
	},
	"networkPolicy with webhook sources": {
		set: []string{"networkPolicy.enabled=true", "networkPolicy.apiServerCIDRs={192.0.2.10/32}",
			`--set-json=networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"192.0.2.10/32"}}]`},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			in := find(t, objs, "NetworkPolicy", releasePrefix+"manager-ingress")
			rules, _, _ := unstructured.NestedSlice(in.Object, "spec", "ingress")
			for _, r := range rules {
				rule := r.(map[string]any)
				ports, _ := rule["ports"].([]any)
				if len(ports) == 1 && fmt.Sprint(ports[0].(map[string]any)["port"]) == "9443" {
					from, _ := rule["from"].([]any)
					if len(from) != 1 || !strings.Contains(fmt.Sprint(from[0]), "192.0.2.10/32") {
						t.Errorf("the webhook's ingress rule allows %v; want only networkPolicy.webhookFrom", from)
					}
					return
				}
			}
			t.Errorf("no ingress rule for the webhook port 9443:\n%s", toYAML(t, in))
		},
	},
}

// checkClientCA asserts that the manager reads the webhook's client CAs
// from key of the volume source kind (secret, configMap) named name, mounted
// read-only.
func checkClientCA(t *testing.T, objs []*unstructured.Unstructured, kind, nameField, name, key string) {
	t.Helper()
	const dir = "/etc/lockwarden/webhook-client-ca"
	dep := find(t, objs, "Deployment", releasePrefix+"controller-manager")
	if args := managerArgs(t, dep); !slices.Contains(args, "--webhook-client-ca-file="+dir+"/"+key) {
		t.Errorf("manager args %q lack --webhook-client-ca-file=%s/%s", args, dir, key)
	}
	mounts, _, _ := unstructured.NestedSlice(managerContainer(t, dep), "volumeMounts")
	var mounted bool
	for _, m := range mounts {
		m := m.(map[string]any)
		if m["name"] == "webhook-client-ca" {
			mounted = m["mountPath"] == dir && m["readOnly"] == true
		}
	}
	if !mounted {
		t.Errorf("the manager does not mount the volume webhook-client-ca read-only at %s: %v", dir, mounts)
	}
	vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		v := v.(map[string]any)
		if v["name"] != "webhook-client-ca" {
			continue
		}
		if got, _, _ := unstructured.NestedString(v, kind, nameField); got != name {
			t.Errorf("volume webhook-client-ca is %v, want %s %s", v, kind, name)
		}
		if items, _, _ := unstructured.NestedSlice(v, kind, "items"); len(items) != 1 || items[0].(map[string]any)["key"] != key {
			t.Errorf("volume webhook-client-ca projects %v, want the key %s", items, key)
		}
		return
	}
	t.Errorf("no volume webhook-client-ca: %v", vols)
}

// renderArgs are the arguments of `helm template` for a value set.
func renderArgs(release, namespace string, set []string) []string {
	return append([]string{"template", release, chartDir, "--namespace", namespace, "--include-crds"}, setFlags(set)...)
}

// setFlags turns a value set's entries into helm flags (see valueSet.set).
func setFlags(set []string) []string {
	var args []string
	for _, s := range set {
		if strings.HasPrefix(s, "--") {
			args = append(args, s)
		} else {
			args = append(args, "--set", s)
		}
	}
	return args
}

// render renders the chart with helm template, CRDs included.
func render(t testing.TB, release, namespace string, set ...string) []*unstructured.Unstructured {
	t.Helper()
	return decode(t, "the rendered chart", run(t, "helm", renderArgs(release, namespace, set)...))
}

func TestLint(t *testing.T) {
	// --strict fails on warnings too (a value the templates do not use, a missing field).
	run(t, "helm", "lint", "--strict", chartDir)
	for name, vs := range valueSets {
		args := append([]string{"lint", "--strict", chartDir}, setFlags(vs.set)...)
		if _, err := runErr(t, "helm", args...); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRender(t *testing.T) {
	for name, vs := range valueSets {
		t.Run(name, func(t *testing.T) {
			objs := render(t, releaseName, releaseNamespace, vs.set...)
			vs.check(t, objs)
		})
	}
}

// TestRenderRefusesBadValues: a value the chart cannot honour stops the
// install with a message that names the value and what is valid.
func TestRenderRefusesBadValues(t *testing.T) {
	tests := map[string]struct {
		set  []string
		want []string
	}{
		"unknown certificate mode": {
			set:  []string{"webhook.certificate.mode=vault"},
			want: []string{"webhook.certificate.mode", `"self-signed"`, `"cert-manager"`},
		},
		"network policy without the API server": {
			set:  []string{"networkPolicy.enabled=true"},
			want: []string{"networkPolicy.apiServerCIDRs"},
		},
		"a cluster lock backend without a name": {
			set:  []string{`--set-json=clusterLockBackends=[{"spec":{"redis":{"endpoints":["redis:6379"]}}}]`},
			want: []string{"clusterLockBackends[0].name"},
		},
		"a cluster lock backend without a spec": {
			set:  []string{`--set-json=clusterLockBackends=[{"name":"shared-redis"}]`},
			want: []string{"clusterLockBackends[0].spec"},
		},
		"an empty tenant namespace": {
			set:  []string{`--set-json=tenantQuota.namespaces=["team-a",""]`},
			want: []string{"tenantQuota.namespaces[1]"},
		},
		"a webhook client CA from both a Secret and a ConfigMap": {
			set:  []string{"webhook.clientCA.secretName=ca", "webhook.clientCA.configMapName=ca"},
			want: []string{"webhook.clientCA", "secretName", "configMapName"},
		},
		"webhook client names without a client CA": {
			set:  []string{"webhook.clientNames={kube-apiserver}"},
			want: []string{"webhook.clientNames", "webhook.clientCA.secretName"},
		},
		"replicas without leader election": {
			set:  []string{"leaderElection.enabled=false"},
			want: []string{"replicaCount", "leaderElection.enabled"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := runErr(t, "helm", renderArgs(releaseName, releaseNamespace, tc.set)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.set, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not name %s:\n%v", w, err)
				}
			}
		})
	}
}

// find returns the object of that kind and name, or fails the test.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	var have []string
	for _, o := range objs {
		have = append(have, objectKey(o))
	}
	t.Fatalf("no %s %s among the rendered objects: %s", kind, name, strings.Join(have, ", "))
	return nil
}

// count returns how many objects are of that kind.
func count(objs []*unstructured.Unstructured, kind string) int {
	n := 0
	for _, o := range objs {
		if o.GetKind() == kind {
			n++
		}
	}
	return n
}

// managerContainer returns the Deployment's manager container.
func managerContainer(t testing.TB, dep *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["name"] == "manager" {
			return m
		}
	}
	t.Fatalf("Deployment %s has no manager container", dep.GetName())
	return nil
}

// managerArgs returns the manager container's args.
func managerArgs(t testing.TB, dep *unstructured.Unstructured) []string {
	t.Helper()
	args, _, _ := unstructured.NestedStringSlice(managerContainer(t, dep), "args")
	return args
}
