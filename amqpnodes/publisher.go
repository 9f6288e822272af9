package amqpnodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpconn"
)

// ErrNotStored marks a Flush that could not get every message stored:
// one the broker returned as unroutable (no queue bound), or one it kept
// nacking through every connection Flush tried.
var ErrNotStored = errors.New("amqpnodes: message not stored by the broker")

// MaxRepublish bounds how often Flush publishes a nacked message again;
// the pauses between rounds grow from 200 ms to 2 s, about 25 s in all,
// longer than a quorum queue's leader election.
const MaxRepublish = 15

// flushEvery is how many messages Publish lets wait for their confirms
// before it flushes; the returns channel holds as many, so that the client
// never blocks delivering a return (which would hold back the confirms).
const flushEvery = 500

// Publisher publishes persistent messages with publisher confirms to one
// node of a cluster, and makes sure the broker stored them: Flush waits for
// the confirms and publishes a message that was not confirmed again,
// through a new connection, under the same MessageId. A message is not
// confirmed when the broker nacked it (a quorum queue nacks publishes while
// it elects a leader, and on RabbitMQ 3.10 a connection that saw the
// election may go on being nacked long after it, where a new connection is
// not), or when its connection died before the confirm came (its node was
// killed, or stopped answering: the connection's heartbeat notices within
// 3 s). The new connection goes to another node when there is one: a node
// that failed is dialled after the others. A message that was not
// confirmed may still have been stored: publish messages with a stable
// MessageId, which idem's consumers deduplicate on.
//
// A Publisher is not safe for concurrent use. Close it when done.
type Publisher struct {
	urls    []string
	node    string        // the node of ch
	ch      *amqp.Channel // nil after a failed connect
	closed  chan struct{} // closed once ch is
	returns chan amqp.Return
	pending []pendingPublish
	pause   func(ctx context.Context, attempt int) error // before republishing
}

// PublisherConnectionName is the connection name a Publisher gives the
// broker (the connection_name client property): how an operator tells its
// connections in the management UI or rabbitmqctl list_connections.
const PublisherConnectionName = "amqpnodes.Publisher"

// pendingPublish is one message awaiting its confirm.
type pendingPublish struct {
	exchange, key string
	msg           amqp.Publishing
	confirm       *amqp.DeferredConfirmation // nil: not sent on a live channel
	closed        <-chan struct{}            // closed once the channel it went out on is
}

// NewPublisher connects to one of urls (as Dial does) and opens a channel
// in confirm mode.
func NewPublisher(ctx context.Context, urls []string) (*Publisher, error) {
	p := &Publisher{urls: urls, pause: republishPause}
	if err := p.connect(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// connect replaces the channel (and its connection) with a new one. The
// channel open and confirm.select wait at most amqpconn.AnswerTimeout.
func (p *Publisher) connect(ctx context.Context) error {
	p.drop()
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(PublisherConnectionName)
	conn, sock, node, err := dial(ctx, p.urls, amqp.Config{Properties: props})
	if err != nil {
		return fmt.Errorf("amqpnodes: publisher: %w", err)
	}
	var ch *amqp.Channel
	err = amqpconn.Bound(ctx, sock, amqpconn.AnswerTimeout, func() (err error) {
		if ch, err = conn.Channel(); err == nil {
			err = ch.Confirm(false)
		}
		return err
	})
	if err != nil {
		_ = conn.Close()
		amqpconn.Suspect(node)
		return fmt.Errorf("amqpnodes: publisher: open a confirm channel on %s: %w", Redact(node), err)
	}
	closed, notify := make(chan struct{}), ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() { // owned by the channel: ends when it closes
		<-notify
		close(closed)
		_ = conn.Close()
	}()
	p.ch, p.node, p.closed = ch, node, closed
	p.returns = ch.NotifyReturn(make(chan amqp.Return, flushEvery))
	return nil
}

// drop closes the current channel, if any; a channel that closed by itself
// marks its node as failed, so that the next dial tries the others first.
func (p *Publisher) drop() {
	if p.ch == nil {
		return
	}
	if p.ch.IsClosed() {
		amqpconn.Suspect(p.node)
	}
	_ = p.ch.Close()
	p.ch = nil
}

// Publish sends msg, persistent and mandatory, to exchange with routing
// key key; Flush waits for its confirm. It flushes by itself every 500
// messages (flushEvery), and when the connection died: the messages not
// confirmed go out again through another node, under their MessageId.
// Give each message its id once (idem.NewMessageID makes a time-ordered
// one) and keep it when you publish it again: a message without one is
// sent without one, and its consumer decides (see consumer.Config.MessageID).
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	msg.DeliveryMode = amqp.Persistent
	if err := p.send(ctx, pendingPublish{exchange: exchange, key: key, msg: msg}); err != nil {
		return err
	}
	if len(p.pending) >= flushEvery || p.ch == nil || p.ch.IsClosed() {
		return p.Flush(ctx)
	}
	return nil
}

// send publishes m on the current channel and keeps it pending. When there
// is no live channel, m is kept pending unsent, for Flush to send.
func (p *Publisher) send(ctx context.Context, m pendingPublish) error {
	m.confirm, m.closed = nil, nil
	if p.ch != nil && !p.ch.IsClosed() {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, true, false, m.msg)
		switch {
		case err == nil:
			m.confirm, m.closed = dc, p.closed
		case ctx.Err() != nil || !p.ch.IsClosed() && !connectionLost(err):
			return fmt.Errorf("amqpnodes: publish %s: %w", m.msg.MessageId, err)
		default: // the write failed before the client noticed the death
			amqpconn.Suspect(p.node)
			p.drop()
		}
	}
	p.pending = append(p.pending, m)
	return nil
}

// connectionLost reports whether a publish failed because its connection
// is gone (a write to a reset socket, a closed connection), rather than
// because of the message.
func connectionLost(err error) bool {
	var ne net.Error
	return errors.Is(err, amqp.ErrClosed) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Flush waits until the broker stored every message published so far. It
// publishes the ones not confirmed (nacked, or whose connection died) again
// through a new connection, up to MaxRepublish times, and fails with
// ErrNotStored for a message the broker returned as unroutable or never
// stored.
func (p *Publisher) Flush(ctx context.Context) error {
	for attempt := 0; len(p.pending) > 0; attempt++ {
		var again []pendingPublish
		for _, m := range p.pending {
			ok, err := m.wait(ctx)
			if err != nil {
				return fmt.Errorf("amqpnodes: confirm of %s: %w", m.msg.MessageId, err)
			}
			if !ok {
				again = append(again, m)
			}
		}
		p.pending = p.pending[:0]
		// The broker sends a return before the confirm of its message. The
		// client closes the returns channel with its AMQP channel: that
		// is no return.
		select {
		case r, ok := <-p.returns:
			if ok {
				return fmt.Errorf("%w: %s was unroutable (%s)", ErrNotStored, r.MessageId, r.ReplyText)
			}
		default:
		}
		if len(again) == 0 {
			return nil
		}
		if attempt == MaxRepublish {
			return fmt.Errorf("%w: %s not confirmed after %d attempts", ErrNotStored, again[0].msg.MessageId, attempt+1)
		}
		if err := p.pause(ctx, attempt); err != nil {
			p.pending = again
			return err
		}
		if err := p.connect(ctx); err != nil && (ctx.Err() != nil || errors.Is(err, ErrRefused)) {
			p.pending = again
			return err
		}
		for _, m := range again { // with no channel (connect failed), kept for the next round
			if err := p.send(ctx, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// wait waits for m's confirm and reports whether the broker acked it. A
// message that never went out, or whose channel closed before its confirm
// came, was not confirmed.
func (m pendingPublish) wait(ctx context.Context) (bool, error) {
	if m.confirm == nil {
		return false, nil
	}
	select {
	case <-m.confirm.Done():
		return m.confirm.Acked(), nil
	case <-m.closed:
		// The client nacks what a closed channel never confirmed; an ack
		// read before the close is there already.
		select {
		case <-m.confirm.Done():
			return m.confirm.Acked(), nil
		default:
			return false, nil
		}
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// republishPause waits before republishing round attempt+1: 200 ms,
// doubling up to 2 s.
func republishPause(ctx context.Context, attempt int) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(min(200*time.Millisecond<<attempt, 2*time.Second)):
		return nil
	}
}

// Close closes the channel and its connection, dropping the confirms still
// awaited: call Flush first.
func (p *Publisher) Close() error {
	if p.ch == nil {
		return nil
	}
	err := p.ch.Close()
	p.ch = nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}
