package etcdtest

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// serverCerts creates a CA and a server certificate for 127.0.0.1 and
// localhost in dir (shared by every member), returning the CA PEM and the
// certificate and key paths.
func serverCerts(dir string) (caPEM []byte, certFile, keyFile string, err error) {
	ca, err := testpki.NewCA("etcdtest CA", 24*time.Hour)
	if err != nil {
		return nil, "", "", err
	}
	kp, err := ca.Issue(testpki.Leaf{
		CommonName: "127.0.0.1",
		Hosts:      []string{"127.0.0.1", "localhost"},
		Usage:      []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	err = testpki.WriteFiles(map[string][]byte{
		filepath.Join(dir, "ca.crt"): ca.PEM,
		certFile:                     kp.CertPEM,
		keyFile:                      kp.KeyPEM,
	})
	if err != nil {
		return nil, "", "", err
	}
	return ca.PEM, certFile, keyFile, nil
}

// ClientTLS returns a TLS configuration that trusts the cluster's CA, or nil
// when the cluster was started without WithTLS.
func (c *Cluster) ClientTLS() *tls.Config {
	if c.CAPEM == nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAPEM)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}
