package consumer

import (
	"context"
	"errors"
	"time"
)

// Incoming is a message handed to Process by a source other than the
// built-in queue consumer: a test, a replay, a custom transport.
type Incoming struct {
	// MessageID is the id property (what IDFromProperty returns).
	MessageID string
	// Body is the payload.
	Body []byte
	// Headers are the message headers.
	Headers map[string]any
	// ContentType is the content type.
	ContentType string
	// CorrelationID is the correlation id.
	CorrelationID string
	// Exchange and RoutingKey say where the message was published.
	Exchange, RoutingKey string
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// Attempt is the processing attempt, 1 when zero.
	Attempt int
	// Source is the queue or stream name; Config.Queue when empty.
	Source string
	// Offset is the stream offset when HasOffset.
	Offset int64
	// HasOffset reports whether Offset is set.
	HasOffset bool
	// Timestamp is the publisher's timestamp.
	Timestamp time.Time
}

// Outcome says what became of one message passed to Process.
type Outcome struct {
	// MessageID is the id the inbox used (empty when the message had none).
	MessageID string
	// Result is "processed", "duplicate", "dead_lettered", "retried" or "unresolved".
	Result string
	// Reason is the dead-letter reason, for "dead_lettered".
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
}

// Process runs msgs as one batch through the same pipeline as Run (payload
// hash, identity, inbox claim, savepoint, handler, dead-letter rows, commit)
// without a broker, and reports each message's outcome. Nothing is
// published: a "retried" message is simply not committed, a "dead_lettered"
// one has its row in the dead-letter table. Process needs no AMQPURL or
// Queue; it is what tests (see package consumertest) and custom sources call.
func (c *Consumer) Process(ctx context.Context, msgs []Incoming) ([]Outcome, error) {
	if c.handler == nil {
		return nil, configError("no handler: call Handle before Process")
	}
	prepared := make([]*Message, len(msgs))
	for i, in := range msgs {
		prepared[i] = c.fromIncoming(in)
	}
	results, err := c.processBatch(ctx, prepared, batchHooks{})
	if err != nil {
		return nil, err
	}
	c.counts.count(results)
	out := make([]Outcome, len(results))
	for i, r := range results {
		out[i] = Outcome{MessageID: prepared[i].ID, Result: r.outcome.String(), Reason: r.reason, Err: r.err}
	}
	return out, nil
}

// fromIncoming turns an Incoming into a prepared Message.
func (c *Consumer) fromIncoming(in Incoming) *Message {
	m := &Message{
		Body:          in.Body,
		Headers:       in.Headers,
		ContentType:   in.ContentType,
		CorrelationID: in.CorrelationID,
		Exchange:      in.Exchange,
		RoutingKey:    in.RoutingKey,
		Redelivered:   in.Redelivered,
		Attempt:       max(in.Attempt, 1),
		Source:        in.Source,
		Offset:        in.Offset,
		HasOffset:     in.HasOffset,
		Timestamp:     in.Timestamp,
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	if m.Source == "" {
		m.Source = c.cfg.Queue
	}
	c.prepare(m, in.MessageID)
	return m
}

// IsBatchError reports whether err from Process means the batch transaction
// failed as a whole (nothing in it is known to have committed; run it again).
func IsBatchError(err error) bool {
	var be *batchError
	return errors.As(err, &be)
}
