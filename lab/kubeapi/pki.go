package kubeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files generated once per Server in its directory and kept across
// restarts, so clients and tokens stay valid.
type files struct {
	caCert      string // CA that signed the serving certificate (kubeconfig trusts it)
	servingCert string
	servingKey  string
	saKey       string // ECDSA key: signs and verifies ServiceAccount tokens
	tokens      string // --token-auth-file
	certDir     string // --cert-dir (unused while the serving pair is given; required by the rig's flags)
	etcd        string // etcd data directory
	adminToken  string
}

func writePKI(dir string) (*files, error) {
	f := &files{
		caCert:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		saKey:       filepath.Join(dir, "sa.key"),
		tokens:      filepath.Join(dir, "tokens.csv"),
		certDir:     filepath.Join(dir, "certs"),
		etcd:        filepath.Join(dir, "etcd"),
	}
	if err := os.MkdirAll(f.certDir, 0o700); err != nil {
		return nil, err
	}
	ca, caKey, caDER, err := newCA()
	if err != nil {
		return nil, err
	}
	srvKey, srvDER, err := newServingCert(ca, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	f.adminToken = hex.EncodeToString(token)

	if err := writePEM(f.caCert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	if err := writePEM(f.servingCert, "CERTIFICATE", srvDER); err != nil {
		return nil, err
	}
	if err := writeKey(f.servingKey, srvKey); err != nil {
		return nil, err
	}
	if err := writeKey(f.saKey, saKey); err != nil {
		return nil, err
	}
	// token,user,uid,"group,..." — the admin is in system:masters, which
	// RBAC's bootstrap policy binds to cluster-admin.
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", f.adminToken, AdminUser, AdminUser)
	if err := os.WriteFile(f.tokens, []byte(line), 0o600); err != nil {
		return nil, err
	}
	return f, nil
}

// newCA makes the self-signed CA of a Server, valid for a week.
func newCA() (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, der, err := newCert(&x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "xvs-test-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, key, der, nil
}

// newServingCert makes the apiserver's serving certificate, signed by ca,
// for the names and loopback addresses its clients dial.
func newServingCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte, error) {
	key, der, err := newCert(&x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}, ca, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate: %w", err)
	}
	return key, der, nil
}

// newCert makes a P-256 key and a certificate of tmpl for it, valid from an
// hour ago for a week, signed by parent (nil: self-signed).
func newCert(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(7*24*time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	return key, der, nil
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
