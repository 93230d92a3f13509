package devcluster

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"os"
	"reflect"
	"testing"
)

// TestServingCertificateNames keeps the names the API server is reached by
// (from this machine and from inside the cluster) in its certificate.
func TestServingCertificateNames(t *testing.T) {
	p, err := writePKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(p.servingCrt, p.servingKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(p.caCert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	for _, name := range []string{"127.0.0.1", APIServerHost, serviceIP, "localhost", "kubernetes.default.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
}

// TestTokenFile keeps the operator's static token a ServiceAccount's
// identity, as config/default's bindings and admission policy name it.
func TestTokenFile(t *testing.T) {
	rows, err := csv.NewReader(bytes.NewReader(tokenFile("admintoken", "operatortoken"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"admintoken", "admin", "admin", "system:masters"},
		{"operatortoken", "system:serviceaccount:lockwarden-system:lockwarden-controller-manager", "lockwarden-controller-manager",
			"system:serviceaccounts,system:serviceaccounts:lockwarden-system,system:authenticated"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("token file rows = %q, want %q", rows, want)
	}
}
