package amqpconn

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// tapConn keeps the first bytes read from and written to its connection.
type tapConn struct {
	net.Conn
	mu          sync.Mutex
	read, wrote []byte
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if len(c.read) < 64 {
		c.read = append(c.read, p[:n]...)
	}
	c.mu.Unlock()
	return n, err
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.wrote) < 64 {
		c.wrote = append(c.wrote, p...)
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// dialTapped dials rawURL with cfg as the consumer does, through a tap.
func dialTapped(t *testing.T, rawURL string, cfg amqp.Config) (*amqp.Connection, *tapConn, error) {
	t.Helper()
	var tap *tapConn
	conn, _, err := DialWithin(context.Background(), rawURL, cfg, 10*time.Second, func(c net.Conn) net.Conn {
		tap = &tapConn{Conn: c}
		return tap
	})
	if err == nil {
		t.Cleanup(func() { _ = conn.Close() })
	}
	return conn, tap, err
}

// requireFrames checks that tap saw AMQP, not TLS records: the client's
// protocol header out, the broker's connection.start in.
func requireFrames(t *testing.T, tap *tapConn) {
	t.Helper()
	tap.mu.Lock()
	defer tap.mu.Unlock()
	require.True(t, bytes.HasPrefix(tap.wrote, []byte("AMQP\x00\x00\x09\x01")), "the protocol header, in clear: %q", tap.wrote)
	require.GreaterOrEqual(t, len(tap.read), 11)
	require.Equal(t, byte(1), tap.read[0], "a method frame")
	require.Equal(t, uint16(0), binary.BigEndian.Uint16(tap.read[1:3]), "on channel 0")
	require.Equal(t, [2]uint16{10, 10}, [2]uint16{binary.BigEndian.Uint16(tap.read[7:9]), binary.BigEndian.Uint16(tap.read[9:11])},
		"connection.start")
}

func TestDialOverTLSShowsTheWrapFramesNotCiphertext(t *testing.T) {
	t.Parallel()
	proxy := testbroker.NewTLSProxy(t)
	given := proxy.ClientConfig()
	conn, tap, err := dialTapped(t, proxy.URL()+"?heartbeat=7", amqp.Config{TLSClientConfig: given})
	require.NoError(t, err)
	requireFrames(t, tap)
	require.Equal(t, 7*time.Second, conn.Config.Heartbeat, "the URL's query still counts")
	require.Empty(t, given.ServerName, "the caller's configuration is not changed")
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err, "the broker answers a call over the connection")
	require.Equal(t, 1, proxy.Accepted())
}

func TestDialOverTLSTakesTheCertificateFromTheURL(t *testing.T) {
	t.Parallel()
	proxy := testbroker.NewTLSProxy(t)
	file := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(file, proxy.CACertPEM(), 0o600))
	_, tap, err := dialTapped(t, proxy.URL()+"?cacertfile="+file, amqp.Config{})
	require.NoError(t, err)
	requireFrames(t, tap)
}

func TestDialOverTLSRefusesAnUntrustedBrokerWithoutQuotingThePassword(t *testing.T) {
	t.Parallel()
	proxy := testbroker.NewTLSProxy(t)
	u := "amqps://idem:hunter2@" + proxy.URL()[len("amqps://guest:guest@"):]
	_, _, _, err := DialAny(context.Background(), []string{u}, amqp.Config{}, 10*time.Second, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "certificate")
	require.NotContains(t, err.Error(), "hunter2")
}

func TestOverTLSKeepsWhatTheClientReadsFromTheURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"amqps://h",
		"amqps://u:p%40ss@h:1234/",
		"amqps://u:p@h/%2f?heartbeat=5&auth_mechanism=external&channel_max=9",
		"amqps://u:p@[::1]/v%2Fh?connection_timeout=3000#frag",
		"amqps://h/a?server_name_indication=broker.example",
	} {
		want, err := amqp.ParseURI(raw)
		require.NoError(t, err)
		target, cfg, err := overTLS(raw, nil)
		require.NoError(t, err, raw)
		require.NotNil(t, cfg)
		got, err := amqp.ParseURI(target)
		require.NoError(t, err, target)
		require.Equal(t, "amqp", got.Scheme, target)
		got.Scheme = want.Scheme
		require.Equal(t, want, got, "%s read as %s", raw, target)
		wantName := want.ServerName
		if wantName == "" {
			wantName = want.Host
		}
		require.Equal(t, wantName, cfg.ServerName, raw)
	}
	target, cfg, err := overTLS("amqp://u:p@h/", nil)
	require.NoError(t, err)
	require.Equal(t, "amqp://u:p@h/", target, "an amqp URL as it is")
	require.Nil(t, cfg)
}

// A broker that takes the TCP connection and never answers the TLS
// handshake holds the dial no longer than the timeout, or than ctx.
func TestDialOverTLSBoundsTheHandshake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		cancel  bool
	}{
		{"by the timeout", 200 * time.Millisecond, false},
		{"by the context", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			accepted := make(chan net.Conn, 1)
			go func() { // ends with the listener, closed when the test ends
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
				// The client hello came: the client is in the handshake.
				if _, err := c.Read(make([]byte, 1)); err == nil && tc.cancel {
					cancel()
				}
			}()
			_, _, err = DialWithin(ctx, "amqps://guest:guest@"+ln.Addr().String()+"/", amqp.Config{}, tc.timeout, nil)
			require.ErrorContains(t, err, "TLS handshake")
			if tc.cancel {
				require.ErrorIs(t, err, context.Canceled)
			}
			_ = (<-accepted).Close()
		})
	}
}

// The URL's query reaches the client over amqps as over amqp: asked for
// EXTERNAL, which the test broker does not offer, the client offers nothing
// else.
func TestDialOverTLSKeepsTheAuthMechanismOfTheURL(t *testing.T) {
	t.Parallel()
	proxy := testbroker.NewTLSProxy(t)
	_, _, err := dialTapped(t, proxy.URL()+"?auth_mechanism=external", amqp.Config{TLSClientConfig: proxy.ClientConfig()})
	require.ErrorIs(t, err, amqp.ErrSASL)
}

// certfile and keyfile give the client a certificate, as amqp091-go does;
// a file that cannot be read fails the dial, its error quoting no password.
func TestOverTLSLoadsTheClientCertificateOfTheURL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idem"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))

	_, cfg, err := overTLS("amqps://u:hunter2@h/?auth_mechanism=external&certfile="+certFile+"&keyfile="+keyFile, nil)
	require.NoError(t, err)
	require.Len(t, cfg.Certificates, 1)
	require.Equal(t, der, cfg.Certificates[0].Certificate[0])

	u := "amqps://u:hunter2@127.0.0.1:1/?cacertfile=" + filepath.Join(dir, "missing.pem")
	_, _, _, err = DialAny(context.Background(), []string{u}, amqp.Config{}, time.Second, nil)
	require.ErrorContains(t, err, "read CA certificate")
	require.NotContains(t, err.Error(), "hunter2")
}
