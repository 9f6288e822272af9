package amqpnodes

import (
	"context"
	"fmt"
	"net"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpurl"
)

// ErrMalformed marks a URL, or a list of them, that cannot name a broker:
// a URL the client cannot parse, or one that holds several URLs or hosts
// (the client would read "amqp://h1/,amqp://h2/" as one node whose vhost
// is ",amqp://h2/"). It matches idem.ErrConfig.
var ErrMalformed = amqpurl.ErrMalformed

// ErrRefused marks a dial that a node refused in a way dialling again
// cannot change: credentials or access refused, or a vhost that does not
// exist. Users, permissions and vhosts belong to the whole cluster.
var ErrRefused = amqpconn.ErrRefused

// Split returns the URLs of list, separated by commas, each checked; the
// error, wrapping ErrMalformed, never quotes a password.
func Split(list string) ([]string, error) { return amqpurl.Split(list) }

// Redact returns s, one URL or several, with every password hidden.
func Redact(s string) string { return amqpurl.Redact(s) }

// DialTimeout bounds the TCP connect and the handshake of one node in Dial.
const DialTimeout = amqpconn.DialTimeout

// Dial connects to the first node of urls that answers, with cfg (its Dial
// is replaced: each node's connect and handshake are bounded by
// DialTimeout and end when ctx does; a zero cfg.Heartbeat is 2 s, so that a
// node that stops answering is noticed within 3 s). The nodes are tried in
// a shuffled order, except that those that failed lately in this process
// come last. It returns the connection and the URL of the node it reached.
// An empty list, or a URL that cannot name a broker, is an error wrapping
// ErrMalformed (and so idem.ErrConfig), before any dial. When no node
// answers, the error names each node's failure, redacted, and wraps
// ErrRefused when a node refused (the nodes after it are not dialled).
func Dial(ctx context.Context, urls []string, cfg amqp.Config) (*amqp.Connection, string, error) {
	conn, _, node, err := dial(ctx, urls, cfg)
	return conn, node, err
}

// dial is Dial, returning the connection's socket too: closing it ends a
// call that waits for an answer (amqpconn.Bound).
func dial(ctx context.Context, urls []string, cfg amqp.Config) (*amqp.Connection, net.Conn, string, error) {
	if err := amqpurl.CheckAll(urls); err != nil {
		return nil, nil, "", fmt.Errorf("amqpnodes: dial: %w", err)
	}
	return amqpconn.DialAny(ctx, urls, cfg, DialTimeout, nil)
}
