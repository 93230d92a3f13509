// Package testpki makes throw-away certificates for tests and local clusters:
// a CA, certificates it signs for servers and clients, and their PEM files.
//
// Keys are ECDSA P-256; nothing here is meant to protect anything.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	// PEM is the CA certificate, PEM-encoded: what clients trust.
	PEM []byte

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// KeyPair is a certificate and its private key, both PEM-encoded.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Leaf describes a certificate the CA signs.
type Leaf struct {
	CommonName   string
	Organization []string
	// Hosts are the IP addresses and DNS names the certificate is valid for.
	Hosts []string
	// Usage lists the extended key usages. Default: server authentication.
	Usage []x509.ExtKeyUsage
}

// NewCA creates a CA named commonName, valid from an hour ago for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"lockwarden"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{PEM: EncodePEM("CERTIFICATE", der), cert: cert, key: key}, nil
}

// Issue signs a certificate for l with a new key, valid as long as the CA.
func (ca *CA) Issue(l Leaf) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	usage := l.Usage
	if len(usage) == 0 {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: l.Organization},
		NotBefore:    ca.cert.NotBefore,
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("create certificate for %s: %w", l.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{CertPEM: EncodePEM("CERTIFICATE", der), KeyPEM: EncodePEM("EC PRIVATE KEY", keyDER)}, nil
}

// WriteFiles writes each path's contents, readable by the owner only.
func WriteFiles(files map[string][]byte) error {
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// EncodePEM returns der as one PEM block of type typ ("CERTIFICATE", "PUBLIC KEY", …).
func EncodePEM(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
