package console

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpconn"
)

// The overview reads queue depths with passive declares: they create
// nothing and read the message count and consumers of a queue that exists.
// A probe runs in the background, bounded by probeTimeout; a page waits for
// it at most probeWait and otherwise shows the last answer (or "probing"),
// so a broker that does not answer slows no page down. Answers are reused
// for probeFresh.
const (
	probeTimeout = 3 * time.Second
	probeWait    = 100 * time.Millisecond
	probeFresh   = 5 * time.Second
	maxQueues    = 64
)

// queueDepth is what a passive declare says of a queue.
type queueDepth struct {
	Name      string
	Messages  int
	Consumers int
	Missing   bool // the queue does not exist
	Known     bool // the broker answered for it
}

// brokerView is the last answer of the broker.
type brokerView struct {
	Configured bool // Config.AMQPURLs is set
	Probing    bool // no answer yet
	At         time.Time
	Err        string // why the broker did not answer
	Queues     map[string]queueDepth
}

// brokerProbe runs probes and keeps their last answer.
type brokerProbe struct {
	ctx  context.Context // Console.Close ends it, and any probe running
	urls []string

	mu      sync.Mutex
	last    brokerView
	asked   []string      // the queues of the last probe
	running chan struct{} // closed when the running probe ends; nil when none runs
}

func newBrokerProbe(ctx context.Context, urls []string) *brokerProbe {
	return &brokerProbe{ctx: ctx, urls: urls, last: brokerView{Configured: len(urls) > 0, Probing: true}}
}

// depths returns the depths of queues: the last answer when it is fresh
// and covered them, else a new probe's if it ends within probeWait, else
// the last answer while the probe goes on.
func (b *brokerProbe) depths(ctx context.Context, queues []string) brokerView {
	if len(b.urls) == 0 {
		return brokerView{}
	}
	if len(queues) > maxQueues {
		queues = queues[:maxQueues]
	}
	sort.Strings(queues)
	b.mu.Lock()
	fresh := !b.last.Probing && time.Since(b.last.At) < probeFresh && covers(b.asked, queues)
	if fresh {
		v := b.last
		b.mu.Unlock()
		return v
	}
	done := b.running
	if done == nil {
		done = make(chan struct{})
		b.running = done
		go b.probe(queues, done) // owned by b: bounded by probeTimeout, ended by Console.Close
	}
	b.mu.Unlock()
	t := time.NewTimer(probeWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// covers reports whether every queue of want is in have (both sorted).
func covers(have, want []string) bool {
	for _, q := range want {
		if i := sort.SearchStrings(have, q); i == len(have) || have[i] != q {
			return false
		}
	}
	return true
}

// probe declares each queue passively on a connection of its own and
// records the answer.
func (b *brokerProbe) probe(queues []string, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(b.ctx, probeTimeout)
	defer cancel()
	v := brokerView{Configured: true, At: time.Now(), Queues: map[string]queueDepth{}}
	if err := declareAll(ctx, b.urls, queues, v.Queues); err != nil {
		v.Err = err.Error()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last, b.asked, b.running = v, queues, nil
}

// declareAll declares queues passively into out. A queue that does not
// exist closes its channel (404); the next queue gets a new one.
func declareAll(ctx context.Context, urls, queues []string, out map[string]queueDepth) error {
	conn, err := amqpconn.Dial(ctx, urls, "idem-console", probeTimeout)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	var ch *amqp.Channel
	for _, q := range queues {
		if ch == nil {
			if err := conn.Call(func() (err error) { ch, err = conn.Channel(); return err }); err != nil {
				return err
			}
		}
		var got amqp.Queue
		err := conn.Call(func() (err error) { got, err = ch.QueueDeclarePassive(q, true, false, false, false, nil); return err })
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			out[q] = queueDepth{Name: q, Missing: true, Known: true}
			ch = nil
		case err != nil:
			return err
		default:
			out[q] = queueDepth{Name: q, Messages: got.Messages, Consumers: got.Consumers, Known: true}
		}
	}
	return nil
}
