package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// issue signs l with a new CA and returns the parsed certificate and the CA
// as a pool, failing the test when the key does not match the certificate.
func issue(t *testing.T, l Leaf) (*x509.Certificate, *x509.CertPool) {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatalf("certificate and key do not match: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.PEM) {
		t.Fatal("CA PEM does not parse")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf, roots
}

func TestIssuedCertificateVerifiesForItsHosts(t *testing.T) {
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	leaf, roots := issue(t, Leaf{CommonName: "127.0.0.1", Hosts: []string{"127.0.0.1", "localhost"}, Usage: both})
	for _, host := range []string{"127.0.0.1", "localhost"} {
		for _, usage := range both {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("verify for %s, usage %v: %v", host, usage, err)
			}
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: roots}); err == nil {
		t.Error("certificate verifies for a host it was not issued for")
	}
}

func TestDefaultUsageIsServerOnly(t *testing.T) {
	leaf, _ := issue(t, Leaf{CommonName: "srv", Hosts: []string{"localhost"}})
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Fatalf("ExtKeyUsage = %v, want server authentication only", leaf.ExtKeyUsage)
	}
}

func TestWriteFilesOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := WriteFiles(map[string][]byte{path: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600", fi.Mode().Perm())
	}
}
