package streamio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/streamclient/amqp"
	"github.com/idemkit/idem/internal/streamclient/message"
	"github.com/idemkit/idem/internal/streamclient/stream"
)

// Outgoing is a message to publish.
type Outgoing struct {
	// ApplicationProperties become the message's application properties.
	ApplicationProperties map[string]any
	// Body is the message's single data section.
	Body []byte
	// ContentType is the AMQP 1.0 content-type property.
	ContentType string
	// CorrelationID is the AMQP 1.0 correlation-id property.
	CorrelationID string
	// CreationTime is the AMQP 1.0 creation-time property, read back as
	// Record.Timestamp. Default: the time Publish is called.
	CreationTime time.Time
	// MessageID is the AMQP 1.0 message-id property.
	MessageID string
}

// ErrNotConfirmed is returned (wrapped) by Publish when the broker refused a
// message or did not confirm it in time.
var ErrNotConfirmed = errors.New("streamio: message not confirmed")

// publishFrame is how many messages go into one BatchSend, well below the
// 1 MiB frame limit for small messages.
const publishFrame = 500

// Publish appends msgs to stream, in order, and returns once the broker has
// confirmed every one of them. A refused or unconfirmed message makes it
// return an error wrapping ErrNotConfirmed; the messages before it may have
// been stored. Publish opens connections per call: it is meant for tests,
// examples and tools, not for a hot path.
func (e *Env) Publish(ctx context.Context, streamName string, msgs []Outgoing) error {
	if len(msgs) == 0 {
		return nil
	}
	env, err := e.connect(ctx)
	if err != nil {
		return fmt.Errorf("streamio: publish to %s: %w", streamName, err)
	}
	defer e.disconnect(env)
	var p *stream.Producer
	err = call(ctx, func() error {
		var err error
		p, err = env.NewProducer(streamName, stream.NewProducerOptions().SetClientProvidedName("idem-streamio-publish"))
		return err
	})
	if err != nil {
		return fmt.Errorf("streamio: publish to %s: new producer: %w", streamName, err)
	}
	confirms := p.NotifyPublishConfirmation()
	result := make(chan error, 1)
	// The collector ends when every message is settled or when Close closes
	// the confirmation channel.
	go func() {
		settled := 0
		var first error
		for batch := range confirms {
			for _, s := range batch {
				settled++
				if !s.IsConfirmed() && first == nil {
					first = fmt.Errorf("%w: publishing id %d: %v", ErrNotConfirmed, s.GetPublishingId(), s.GetError())
				}
			}
			if settled >= len(msgs) {
				break
			}
		}
		if first == nil && settled < len(msgs) {
			first = fmt.Errorf("%w: %d of %d settled before the producer closed", ErrNotConfirmed, settled, len(msgs))
		}
		result <- first
		for range confirms { // keep the client unblocked until Close
		}
	}()
	defer func() { _ = p.Close() }()

	now := time.Now()
	batch := make([]message.StreamMessage, 0, publishFrame)
	for i, m := range msgs {
		batch = append(batch, toAMQP(m, now))
		if len(batch) == publishFrame || i == len(msgs)-1 {
			if err := p.BatchSend(batch); err != nil {
				return fmt.Errorf("streamio: publish to %s: send: %w", streamName, err)
			}
			batch = batch[:0]
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("streamio: publish to %s: %w", streamName, err)
		}
	}
	select {
	case err := <-result:
		if err != nil {
			return fmt.Errorf("streamio: publish to %s: %w", streamName, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("streamio: publish to %s: waiting for confirms: %w", streamName, ctx.Err())
	}
}

func toAMQP(m Outgoing, now time.Time) *amqp.AMQP10 {
	a := amqp.NewMessage(m.Body)
	created := m.CreationTime
	if created.IsZero() {
		created = now
	}
	a.Properties = &amqp.MessageProperties{
		ContentType:  m.ContentType,
		CreationTime: created,
	}
	if m.MessageID != "" {
		a.Properties.MessageID = m.MessageID
	}
	if m.CorrelationID != "" {
		a.Properties.CorrelationID = m.CorrelationID
	}
	a.ApplicationProperties = m.ApplicationProperties
	return a
}
