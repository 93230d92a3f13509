package devcluster

import (
	"crypto/tls"
	"crypto/x509"
	"os"
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
	for _, name := range []string{"127.0.0.1", serviceIP, "localhost", "kubernetes.default.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
}
