package amqpnodes

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
// the confirms and publishes a nacked message again, through a new
// connection. A quorum queue nacks publishes while it elects a leader, and
// on RabbitMQ 3.10 a connection that saw the election may go on being
// nacked long after it, where a new connection is not. A message the broker
// nacked may still have been stored: publish messages with a stable
// MessageId, which idem's consumers deduplicate on.
//
// A Publisher is not safe for concurrent use. Close it when done.
type Publisher struct {
	urls    []string
	ch      *amqp.Channel
	returns chan amqp.Return
	pending []pendingPublish
	pause   func(ctx context.Context, attempt int) error // before republishing
}

// pendingPublish is one message awaiting its confirm.
type pendingPublish struct {
	exchange, key string
	msg           amqp.Publishing
	confirm       *amqp.DeferredConfirmation
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

// connect replaces the channel (and its connection) with a new one.
func (p *Publisher) connect(ctx context.Context) error {
	if p.ch != nil {
		_ = p.ch.Close()
	}
	p.ch = nil
	conn, _, err := Dial(ctx, p.urls, amqp.Config{})
	if err != nil {
		return fmt.Errorf("amqpnodes: publisher: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("amqpnodes: publisher: open a confirm channel: %w", err)
	}
	go func() { // owned by the channel: ends when it closes
		<-ch.NotifyClose(make(chan *amqp.Error, 1))
		_ = conn.Close()
	}()
	p.ch, p.returns = ch, ch.NotifyReturn(make(chan amqp.Return, flushEvery))
	return nil
}

// Publish sends msg, persistent and mandatory, to exchange with routing
// key key; Flush waits for its confirm. It flushes by itself every 500
// messages (flushEvery).
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	msg.DeliveryMode = amqp.Persistent
	if err := p.send(ctx, pendingPublish{exchange: exchange, key: key, msg: msg}); err != nil {
		return err
	}
	if len(p.pending) >= flushEvery {
		return p.Flush(ctx)
	}
	return nil
}

// send publishes m on the current channel and keeps it pending.
func (p *Publisher) send(ctx context.Context, m pendingPublish) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, true, false, m.msg)
	if err != nil {
		return fmt.Errorf("amqpnodes: publish %s: %w", m.msg.MessageId, err)
	}
	m.confirm = dc
	p.pending = append(p.pending, m)
	return nil
}

// Flush waits until the broker stored every message published so far. It
// publishes the nacked ones again through a new connection, up to
// MaxRepublish times, and fails with ErrNotStored for a message the broker
// returned as unroutable or never stored.
func (p *Publisher) Flush(ctx context.Context) error {
	for attempt := 0; len(p.pending) > 0; attempt++ {
		var nacked []pendingPublish
		for _, m := range p.pending {
			ok, err := m.confirm.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("amqpnodes: confirm of %s: %w", m.msg.MessageId, err)
			}
			if !ok {
				nacked = append(nacked, m)
			}
		}
		p.pending = p.pending[:0]
		// The broker sends a return before the confirm of its message.
		select {
		case r := <-p.returns:
			return fmt.Errorf("%w: %s was unroutable (%s)", ErrNotStored, r.MessageId, r.ReplyText)
		default:
		}
		if len(nacked) == 0 {
			return nil
		}
		if attempt == MaxRepublish {
			return fmt.Errorf("%w: %s nacked %d times", ErrNotStored, nacked[0].msg.MessageId, attempt+1)
		}
		if err := p.pause(ctx, attempt); err != nil {
			return err
		}
		if err := p.connect(ctx); err != nil {
			return err
		}
		for _, m := range nacked {
			if err := p.send(ctx, m); err != nil {
				return err
			}
		}
	}
	return nil
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
