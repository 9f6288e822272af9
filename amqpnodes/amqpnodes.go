package amqpnodes

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpurl"
)

// ErrMalformed marks a URL, or a list of them, that cannot name a broker:
// a URL the client cannot parse, or one that holds several URLs or hosts
// (the client would read "amqp://h1/,amqp://h2/" as one node whose vhost
// is ",amqp://h2/").
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
const DialTimeout = 10 * time.Second

// Dial connects to the first node of urls that answers, in a shuffled
// order, with cfg (its Dial is replaced: each node's connect and handshake
// are bounded by DialTimeout and end when ctx does). It returns the
// connection and the URL of the node it reached. When no node answers, the
// error names each node's failure, redacted, and wraps ErrRefused when a
// node refused.
func Dial(ctx context.Context, urls []string, cfg amqp.Config) (*amqp.Connection, string, error) {
	conn, _, node, err := amqpconn.DialAny(ctx, urls, cfg, DialTimeout, nil)
	return conn, node, err
}
