package testbroker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// TLSProxy stands for a broker that listens for amqps: it terminates TLS,
// with a self-signed certificate made for the test, and forwards the
// connections to the broker's AMQP port. It stops when the test ends: the
// listener closes, every connection is cut and every goroutine it started
// returns.
type TLSProxy struct {
	ln      net.Listener
	target  string
	certPEM []byte
	wg      sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted int
	closed   bool
}

// NewTLSProxy starts a TLS proxy in front of the broker's AMQP port. Dial
// its URL with ClientConfig, or with the certificate of CACertPEM in a
// cacertfile.
func NewTLSProxy(tb testing.TB) *TLSProxy {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("testbroker: parse url: %v", err)
	}
	cert, certPEM := selfSigned(tb)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		tb.Fatalf("testbroker: listen: %v", err)
	}
	p := &TLSProxy{ln: ln, target: u.Host, certPEM: certPEM, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// URL is the broker URL with scheme amqps and the proxy's address.
func (p *TLSProxy) URL() string {
	u, _ := url.Parse(URL())
	u.Scheme, u.Host = "amqps", p.ln.Addr().String()
	return u.String()
}

// ClientConfig is a TLS configuration that trusts the proxy's certificate
// alone.
func (p *TLSProxy) ClientConfig() *tls.Config {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.certPEM)
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// CACertPEM is the proxy's certificate, PEM-encoded, as a cacertfile holds it.
func (p *TLSProxy) CACertPEM() []byte { return p.certPEM }

// Accepted is how many connections the proxy has forwarded so far.
func (p *TLSProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *TLSProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		target, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = target.Close()
			return
		}
		p.accepted++
		p.conns[client], p.conns[target] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(client, target) })
		p.wg.Go(func() { p.pipe(target, client) })
	}
}

// pipe copies what from sends to to, until either fails or closes, then
// closes both.
func (p *TLSProxy) pipe(from, to net.Conn) {
	_, _ = io.Copy(to, from)
	_ = from.Close()
	_ = to.Close()
	p.mu.Lock()
	delete(p.conns, from)
	delete(p.conns, to)
	p.mu.Unlock()
}

// selfSigned makes a certificate for 127.0.0.1, ::1 and localhost, valid
// for a day, signed by its own key.
func selfSigned(tb testing.TB) (tls.Certificate, []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testbroker: key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idem test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testbroker: certificate: %v", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
