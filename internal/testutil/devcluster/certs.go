package devcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// pki holds the paths of the certificates and keys a cluster uses. One CA
// signs one serving certificate for 127.0.0.1, the API server's address and
// localhost (plus the in-cluster names of the kubernetes Service), which the
// API server, the controller manager, the scheduler and the operator's
// webhook all serve.
type pki struct {
	caCert     string
	caPEM      []byte
	servingCrt string
	servingKey string
	// webhookDir holds tls.crt and tls.key, as controller-runtime's webhook server wants them.
	webhookDir string
	// saKey and saPub are the service-account signing key pair.
	saKey string
	saPub string
	// adminToken is the bearer token of the system:masters user "admin".
	adminToken string
	// operatorToken is the bearer token of OperatorUser, the operator's
	// ServiceAccount identity: a static token, since no Pod mounts one.
	operatorToken string
	tokenFile     string
}

func writePKI(dir string) (*pki, error) {
	p := &pki{
		caCert:     filepath.Join(dir, "ca.crt"),
		servingCrt: filepath.Join(dir, "serving.crt"),
		servingKey: filepath.Join(dir, "serving.key"),
		webhookDir: filepath.Join(dir, "webhook"),
		saKey:      filepath.Join(dir, "sa.key"),
		saPub:      filepath.Join(dir, "sa.pub"),
		tokenFile:  filepath.Join(dir, "tokens.csv"),
	}
	if err := os.MkdirAll(p.webhookDir, 0o700); err != nil {
		return nil, err
	}
	ca, err := testpki.NewCA("lockwarden-dev-ca", 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	p.caPEM = ca.PEM
	serving, err := ca.Issue(testpki.Leaf{
		CommonName: "127.0.0.1",
		Hosts: []string{"127.0.0.1", APIServerHost, serviceIP, "localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	})
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}

	if p.adminToken, err = newToken(); err != nil {
		return nil, err
	}
	if p.operatorToken, err = newToken(); err != nil {
		return nil, err
	}

	files := map[string][]byte{
		p.caCert:                               p.caPEM,
		p.servingCrt:                           serving.CertPEM,
		p.servingKey:                           serving.KeyPEM,
		filepath.Join(p.webhookDir, "tls.crt"): serving.CertPEM,
		filepath.Join(p.webhookDir, "tls.key"): serving.KeyPEM,
		p.saKey:                                testpki.EncodePEM("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)),
		p.saPub:                                testpki.EncodePEM("PUBLIC KEY", saPubDER),
		p.tokenFile:                            tokenFile(p.adminToken, p.operatorToken),
		filepath.Join(dir, "README"):           []byte("Throw-away PKI of a local lockwarden development cluster. Never use it elsewhere.\n"),
	}
	if err := testpki.WriteFiles(files); err != nil {
		return nil, err
	}
	return p, nil
}

func newToken() (string, error) {
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return "", err
	}
	return hex.EncodeToString(tok), nil
}

// tokenFile is the API server's --token-auth-file (token,user,uid,"groups"):
// the admin (system:masters) and the operator's ServiceAccount, with the
// groups the API server gives a ServiceAccount's own tokens, so that RBAC
// treats it exactly as it treats the operator's Pod in a real install.
func tokenFile(adminToken, operatorToken string) []byte {
	groups := strings.Join([]string{"system:serviceaccounts", "system:serviceaccounts:" + OperatorNamespace, "system:authenticated"}, ",")
	return []byte(adminToken + `,admin,admin,"system:masters"` + "\n" +
		operatorToken + "," + OperatorUser + "," + OperatorServiceAccount + `,"` + groups + `"` + "\n")
}
