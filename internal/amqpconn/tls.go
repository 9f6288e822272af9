package amqpconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// overTLS prepares the dial of rawURL. For an amqps URL the client would
// put TLS on the socket DialWithin hands it, above wrap, which would then
// read ciphertext instead of frames (and the screen would see no content
// header): DialWithin does the TLS handshake itself and wraps the TLS
// connection, and the client is given target, the same URL with scheme amqp
// and its port made explicit (5671 by default), so that it does not put TLS
// on it again. cfg is the TLS configuration the client would have used:
// given cloned when set, else the one the URL's query describes, its
// ServerName the URL's host unless set. For an amqp URL, target is rawURL
// and cfg nil. Errors quote no password.
func overTLS(rawURL string, given *tls.Config) (target string, cfg *tls.Config, err error) {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil || uri.Scheme != "amqps" {
		return rawURL, nil, nil // the client reports a URL it cannot parse
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL, nil, nil
	}
	u.Scheme, u.Opaque = "amqp", ""
	u.Host = net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	u.Path, u.RawPath = "/"+uri.Vhost, "" // as the client reads it, whatever the spelling
	if given != nil {
		cfg = given.Clone()
	} else if cfg, err = tlsConfigFromURI(uri); err != nil {
		return "", nil, fmt.Errorf("TLS configuration from the URL: %w", err)
	}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	if cfg.MinVersion == 0 {
		cfg.MinVersion = tls.VersionTLS12
	}
	return u.String(), cfg, nil
}

// tlsConfigFromURI is the TLS configuration amqp091-go builds from an amqps
// URL's query when given none (its tlsConfigFromURI, unexported): the
// authorities of cacertfile, else the system's; the client certificate of
// certfile and keyfile when both are set; the server name of
// server_name_indication.
func tlsConfigFromURI(uri amqp.URI) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: uri.ServerName, MinVersion: tls.VersionTLS12}
	if uri.CACertFile != "" {
		pem, err := os.ReadFile(uri.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("read CA certificate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(pem)
	} else {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("load system certificates: %w", err)
		}
		cfg.RootCAs = pool
	}
	if uri.CertFile != "" && uri.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// handshake runs the TLS client handshake over raw, bounded by raw's
// deadline and by ctx, and returns the TLS connection; raw is closed when
// it fails.
func handshake(ctx context.Context, raw net.Conn, cfg *tls.Config) (net.Conn, error) {
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return &tlsConn{Conn: c, raw: raw}, nil
}

// tlsConn is a TLS connection whose Close closes its socket at once. A TLS
// close first sends an alert, and a broker that stopped reading could hold
// it for seconds; closing the socket is how a call that hangs is ended (see
// Bound), and AMQP has its own closing handshake.
type tlsConn struct {
	*tls.Conn
	raw net.Conn
}

func (c *tlsConn) Close() error {
	err := c.raw.Close()
	_ = c.Conn.Close()
	return err
}
