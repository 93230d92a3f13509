package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// Callers is a CA a server trusts for its TLS clients, written to CAFile,
// and client certificates: two from that CA and one from another CA of the
// same name.
type Callers struct {
	// CAFile holds the trusted CA's certificate (PEM).
	CAFile string
	// Trusted is from the trusted CA, named kube-apiserver.
	Trusted *KeyPair
	// OtherName is from the trusted CA, named someone-else.
	OtherName *KeyPair
	// Stranger is from the other CA, named kube-apiserver.
	Stranger *KeyPair
}

// NewCallers makes Callers and writes the CA's certificate into dir.
func NewCallers(t testing.TB, dir string) *Callers {
	t.Helper()
	trusted, err := NewCA("webhook-clients", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("webhook-clients", time.Hour) // same name, another key
	if err != nil {
		t.Fatal(err)
	}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	c := &Callers{CAFile: filepath.Join(dir, "client-ca.crt")}
	for _, issue := range []struct {
		ca   *CA
		name string
		into **KeyPair
	}{{trusted, "kube-apiserver", &c.Trusted}, {trusted, "someone-else", &c.OtherName}, {other, "kube-apiserver", &c.Stranger}} {
		if *issue.into, err = issue.ca.Issue(Leaf{CommonName: issue.name, Usage: client}); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteFiles(map[string][]byte{c.CAFile: trusted.PEM}); err != nil {
		t.Fatal(err)
	}
	return c
}

// HTTPSClient is a client that trusts serverCA (PEM) and presents cert, if
// any; it keeps no connection open between requests.
func HTTPSClient(t testing.TB, serverCA []byte, cert *KeyPair) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(serverCA) {
		t.Fatal("no serving CA certificate")
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		kp, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}
