package redistest

import (
	"crypto/x509"
	"path/filepath"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// writeServerCerts creates a CA and a server certificate for 127.0.0.1 and
// localhost in dir, returning the CA PEM and the certificate and key paths.
func writeServerCerts(dir string) (caPEM []byte, certFile, keyFile string, err error) {
	ca, err := testpki.NewCA("redistest CA", 24*time.Hour)
	if err != nil {
		return nil, "", "", err
	}
	kp, err := ca.Issue(testpki.Leaf{
		CommonName: "127.0.0.1",
		Hosts:      []string{"127.0.0.1", "localhost"},
		Usage:      []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, "", "", err
	}
	certFile = filepath.Join(dir, "server.crt")
	keyFile = filepath.Join(dir, "server.key")
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
