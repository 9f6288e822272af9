package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
)

// sender publishes persistent messages with publisher confirms, on a
// connection to whichever node of the broker answers. When that connection
// is lost (its node was killed), it dials the nodes again and publishes once
// more every message it has not seen confirmed: one the broker had stored
// before the loss then comes twice, a duplicate the workers must absorb
// like any other. A message the broker refuses (nacks) on a live
// connection is published again the same way, on a new connection after a
// pause: on RabbitMQ 3.10 a connection that saw a quorum queue's election
// may go on being refused, where a new one is not. After maxSends
// publishes of one message, it gives up.
type sender struct {
	urls []string
	name string // the connection's connection_name
	logf func(format string, args ...any)

	conn    *amqp.Connection
	ch      *amqp.Channel
	node    string // the URL of the node conn is connected to
	returns chan amqp.Return
	pending []sending // published, not confirmed yet, in publishing order
}

// sending is a message on its way.
type sending struct {
	i     int // the caller's index of the message
	queue string
	msg   amqp.Publishing
	sends int
	dc    *amqp.DeferredConfirmation // nil when its connection was lost before it went out
}

// maxSends bounds the publishes of one message; redialPause is the pause
// between two rounds of dials over the nodes.
const (
	maxSends    = 10
	redialPause = 500 * time.Millisecond
)

// dial connects to a node of s.urls, again and again until one answers or
// ctx ends, and opens a confirming channel on it.
func (s *sender) dial(ctx context.Context) error {
	s.close()
	for {
		err := s.open(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, amqpnodes.ErrRefused) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %w)", s.name, ctx.Err(), err)
		case <-time.After(redialPause):
		}
	}
}

func (s *sender) open(ctx context.Context) error {
	conn, node, err := amqpnodes.Dial(ctx, s.urls, amqp.Config{Properties: amqp.Table{"connection_name": s.name}})
	if err != nil {
		return fmt.Errorf("%s: connect to rabbitmq: %w", s.name, err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("%s: confirming channel on %s: %w", s.name, amqpnodes.Redact(node), err)
	}
	s.conn, s.ch, s.node = conn, ch, node
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
	return nil
}

func (s *sender) close() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}

// publish publishes msg to queue (mandatory: an unroutable message is an
// error, see flush); i is what flush returns for it once confirmed.
func (s *sender) publish(ctx context.Context, i int, queue string, msg amqp.Publishing) error {
	s.pending = append(s.pending, sending{i: i, queue: queue, msg: msg})
	return s.send(ctx, &s.pending[len(s.pending)-1])
}

// send publishes p, once more. A lost connection is no error: p is left
// without a confirmation, and flush publishes it again on the next one. A
// write that fails (its node was killed: the client may not have marked
// the channel closed yet) loses the connection too.
func (s *sender) send(ctx context.Context, p *sending) error {
	if p.sends == maxSends {
		return fmt.Errorf("%s: message %s not confirmed after %d publishes", s.name, p.msg.MessageId, maxSends)
	}
	p.dc = nil
	if s.conn == nil {
		return nil // lost: flush publishes it on the next connection
	}
	p.sends++
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, true, false, p.msg)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("%s: publish %s: %w", s.name, p.msg.MessageId, err)
	case err != nil:
		s.close()
	default:
		p.dc = dc
	}
	return nil
}

// flush waits until the broker has confirmed every message published and
// returns the callers' indexes of those it confirmed, in publishing order.
func (s *sender) flush(ctx context.Context) ([]int, error) {
	var done []int
	for len(s.pending) > 0 {
		p := &s.pending[0]
		ok := false
		if p.dc != nil {
			var err error
			if ok, err = p.dc.WaitContext(ctx); err != nil {
				return done, fmt.Errorf("%s: confirm %s: %w", s.name, p.msg.MessageId, err)
			}
		}
		if ok {
			done = append(done, p.i)
			s.pending = s.pending[1:]
			continue
		}
		if err := s.resend(ctx); err != nil {
			return done, err
		}
	}
	select {
	case r, open := <-s.returns:
		if open {
			return done, fmt.Errorf("%s: message %s was unroutable: %s", s.name, r.MessageId, r.ReplyText)
		}
	default:
	}
	return done, nil
}

// resend publishes every pending message the broker has not confirmed
// again, on a new connection: the first was refused, or the connection was
// lost.
func (s *sender) resend(ctx context.Context) error {
	old, what := s.node, "lost"
	if s.conn != nil && !s.ch.IsClosed() {
		what = "refused " + s.pending[0].msg.MessageId
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(redialPause):
		}
	}
	if err := s.dial(ctx); err != nil {
		return err
	}
	s.logf("%s: connection to %s %s; on %s now, publishing its %d unconfirmed messages again",
		s.name, amqpnodes.Redact(old), what, amqpnodes.Redact(s.node), len(s.pending))
	for j := range s.pending {
		if p := &s.pending[j]; p.dc != nil && p.dc.Acked() {
			continue // confirmed before the loss, behind one that was not
		}
		if err := s.send(ctx, &s.pending[j]); err != nil {
			return err
		}
	}
	return nil
}
