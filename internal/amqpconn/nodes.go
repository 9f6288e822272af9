package amqpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpurl"
)

// ErrRefused marks a dial that a broker answered with a refusal that
// dialling again cannot change: credentials or access refused (403), or a
// vhost that does not exist (530). Users, permissions and vhosts belong to
// the whole cluster, so one node's refusal is the cluster's.
var ErrRefused = errors.New("broker refused the connection")

// Timeouts and the heartbeat of every AMQP connection idem dials, sized
// so that a node that stops answering (a frozen process, a host gone
// silent, a listener that accepts and never speaks) costs seconds.
const (
	// DialTimeout bounds one node's TCP connect and AMQP handshake: a
	// handshake takes milliseconds, so a node that has not finished within
	// it is not going to, and the next node is dialled.
	DialTimeout = 5 * time.Second
	// Heartbeat is the heartbeat interval idem asks the broker for (the
	// smaller of the two sides' wins). amqp091-go declares a connection
	// dead once it read nothing for 1.5 intervals: a silent node is noticed
	// within 3 s, where the client's default (10 s) takes 15 s and the
	// broker's (60 s) 90 s.
	Heartbeat = 2 * time.Second
	// AnswerTimeout bounds a call that sets a session up (channel.open,
	// queue.declare, basic.qos, confirm.select, basic.consume): a node
	// answers in milliseconds, unless it waits on a frozen peer that leads
	// the queue, and then another node is tried.
	AnswerTimeout = 5 * time.Second
)

// DialAny dials the nodes of urls, each as DialWithin does (timeout bounds
// each node's connect and handshake), and returns the first connection
// that opens, its socket and the URL it reached. The nodes are dialled in
// a shuffled order, except that a node that failed lately in this process
// (its dial, or a connection to it: see Suspect) comes after those that did
// not, the most recent failure last (see Order). A zero cfg.Heartbeat is
// Heartbeat. One call is one round of the list: the caller's backoff runs
// between rounds, not between nodes. A refusal that dialling again cannot
// change (see ErrRefused), given twice in a row by a node, ends the round at
// once: the other nodes would refuse the same credentials. When no node opens, the error names every
// failure (URLs redacted) and wraps ErrRefused on a refusal, else the last
// failure.
func DialAny(ctx context.Context, urls []string, cfg amqp.Config, timeout time.Duration, wrap func(net.Conn) net.Conn) (*amqp.Connection, net.Conn, string, error) {
	if len(urls) == 0 {
		return nil, nil, "", errors.New("no broker URL")
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = Heartbeat
	}
	var (
		fails []string
		last  error
	)
	for _, u := range suspects.order(urls, time.Now()) {
		conn, sock, err := DialWithin(ctx, u, cfg, timeout, wrap)
		if Refused(err) && ctx.Err() == nil {
			// The client reports a socket that closed during the handshake
			// (a connection cut, a node stopping) as a refusal of the
			// credentials or the vhost, though the broker said nothing:
			// only a second refusal in a row is the broker's word.
			conn, sock, err = DialWithin(ctx, u, cfg, timeout, wrap)
		}
		if err == nil {
			return conn, sock, u, nil
		}
		if ctx.Err() != nil {
			return nil, nil, "", err
		}
		last = err
		fails = append(fails, fmt.Sprintf("%s: %v", amqpurl.Redact(u), scrub(err, u)))
		if Refused(err) {
			break
		}
		Suspect(u)
	}
	msg := "dial " + strings.Join(fails, "; ")
	if len(urls) > 1 {
		msg = fmt.Sprintf("no node of %d took the connection: %s", len(urls), msg)
	}
	if Refused(last) {
		return nil, nil, "", fmt.Errorf("%w: %s", ErrRefused, msg)
	}
	return nil, nil, "", fmt.Errorf("%s: %w", msg, last)
}

// suspectFor is how long a node's failure puts it behind the others.
const suspectFor = time.Minute

// suspects are the nodes that failed lately in this process, shared by
// every dial of it: a node that one connection found dead is dialled last
// by the next, whichever part of the process dials.
var suspects = &failures{at: map[string]time.Time{}}

// failures remembers when each node last failed.
type failures struct {
	mu sync.Mutex
	at map[string]time.Time
}

// Suspect records that a connection to the node url failed now (it died,
// or a call on it got no answer): dials in the next minute try it after
// the nodes that did not fail. A connection's owner calls it when the
// connection ends other than by its own Close.
func Suspect(url string) {
	suspects.mu.Lock()
	defer suspects.mu.Unlock()
	suspects.at[url] = time.Now()
}

// order returns urls in the order to dial them at now (see Order).
func (f *failures) order(urls []string, now time.Time) []string {
	f.mu.Lock()
	failedAt := make(map[string]time.Time, len(urls))
	for _, u := range urls {
		if t, ok := f.at[u]; ok && now.Sub(t) < suspectFor {
			failedAt[u] = t
		}
	}
	f.mu.Unlock()
	return Order(urls, failedAt)
}

// Order returns urls in a shuffled order, except that the nodes in
// failedAt come after the others, by the time they failed: the node that
// failed last is dialled last. A fleet given one list spreads over the
// nodes that work, and a node that just failed (a frozen process, which
// costs a whole DialTimeout) is not dialled again while another may open.
func Order(urls []string, failedAt map[string]time.Time) []string {
	out := amqpurl.Shuffled(urls)
	slices.SortStableFunc(out, func(a, b string) int { return failedAt[a].Compare(failedAt[b]) })
	return out
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
