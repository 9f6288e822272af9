package amqpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpurl"
)

// ErrRefused marks a dial that a broker answered with a refusal that
// dialling again cannot change: credentials or access refused (403), or a
// vhost that does not exist (530). Users, permissions and vhosts belong to
// the whole cluster, so one node's refusal is the cluster's.
var ErrRefused = errors.New("broker refused the connection")

// DialAny dials the nodes of urls in a shuffled order, each as DialWithin
// does (timeout bounds each node's connect and handshake), and returns the
// first connection that opens, its socket and the URL it reached. One call
// is one round of the list: the caller's backoff runs between rounds, not
// between nodes. When no node opens, the error names every node's failure
// (URLs redacted) and wraps ErrRefused if any node refused (see ErrRefused),
// else the last failure.
func DialAny(ctx context.Context, urls []string, cfg amqp.Config, timeout time.Duration, wrap func(net.Conn) net.Conn) (*amqp.Connection, net.Conn, string, error) {
	if len(urls) == 0 {
		return nil, nil, "", errors.New("no broker URL")
	}
	var (
		fails   []string
		last    error
		refused bool
	)
	for _, u := range amqpurl.Shuffled(urls) {
		conn, sock, err := DialWithin(ctx, u, cfg, timeout, wrap)
		if err == nil {
			return conn, sock, u, nil
		}
		if ctx.Err() != nil {
			return nil, nil, "", err
		}
		last = err
		refused = refused || Refused(err)
		fails = append(fails, fmt.Sprintf("%s: %v", amqpurl.Redact(u), scrub(err, u)))
	}
	msg := "dial " + strings.Join(fails, "; ")
	if len(urls) > 1 {
		msg = fmt.Sprintf("no node of %d took the connection: %s", len(urls), msg)
	}
	if refused {
		return nil, nil, "", fmt.Errorf("%w: %s", ErrRefused, msg)
	}
	return nil, nil, "", fmt.Errorf("%s: %w", msg, last)
}

// Refused reports whether err is a broker's refusal that dialling again
// cannot change (see ErrRefused). A 530 that is not about a missing vhost
// (a connection limit reached) is not: it may pass.
func Refused(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused:
		return true
	case amqp.NotAllowed:
		return strings.Contains(ae.Reason, "vhost") && strings.Contains(ae.Reason, "not found")
	}
	return false
}

// scrub returns err's text without rawURL's password: the client quotes a
// URL it cannot parse.
func scrub(err error, rawURL string) string {
	msg := err.Error()
	if strings.Contains(msg, rawURL) {
		msg = strings.ReplaceAll(msg, rawURL, amqpurl.Redact(rawURL))
	}
	return msg
}
