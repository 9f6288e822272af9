package deadletters

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// A message that sat in the dead-letter queue longer than the consumer's
// inbox retention may have lost the row it would be recognised by: a
// payload conflict whose original was applied, a copy of a message
// processed meanwhile. Redrive asks the consumer's inbox horizon
// (inbox.Inbox.CheckSeen) with the time the message entered the dead-letter
// queue, and leaves in the queue every message that entered it no later
// than the newest sighting retention forgot. Before it asks, it touches the
// message's row (inbox.Inbox.Touch), so that a clean-up running meanwhile
// either deletes the row first, and records the horizon that refuses the
// message, or leaves it to outlive the message's trip back.

// enteredSQL is when the dead-letter row that marks a message (the row
// markSQL would mark) was written, and the message id it holds.
func enteredSQL(t idem.Tables) string {
	return `SELECT dead_lettered_at, message_id FROM ` + t.WithDefaults().Table("dead_letters") + `
WHERE consumer = $1 AND payload_hash = $2 AND ($3::text IS NULL OR reason = $3::text) AND redriven_at IS NULL
ORDER BY id LIMIT 1`
}

// beyondHorizon returns an error wrapping inbox.ErrBeyondHorizon when d
// could come back without its inbox row, or when the consumer or the time
// it entered the dead-letter queue cannot be known, which leaves the
// question open; nil when it may go back.
func (r *redrive) beyondHorizon(ctx context.Context, d amqp.Delivery) error {
	if r.o.AllowBeyondHorizon {
		return nil
	}
	consumer, _ := d.Headers[HeaderConsumer].(string)
	if consumer == "" {
		consumer = r.o.Consumer
	}
	if consumer == "" {
		return fmt.Errorf("%w: message %q names no consumer (x-idem-consumer): pass the consumer (--consumer) to check its inbox horizon",
			inbox.ErrBeyondHorizon, d.MessageId)
	}
	at, id, err := r.entered(ctx, consumer, d)
	if err != nil {
		return err
	}
	if _, err := r.ib.Touch(ctx, r.o.Pool, consumer, id); err != nil {
		return fmt.Errorf("deadletters: redrive: %w", err)
	}
	if err := r.ib.CheckSeen(ctx, r.o.Pool, consumer, at); err != nil {
		return fmt.Errorf("message %q entered %s at %s: %w", d.MessageId, r.o.DeadLetterQueue,
			at.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// entered returns when d entered the dead-letter queue and its message id:
// its dead-letter row's time and id, or for a message the broker
// dead-lettered itself the time of its x-death entry and its message-id
// property.
func (r *redrive) entered(ctx context.Context, consumer string, d amqp.Delivery) (time.Time, string, error) {
	hexHash, _ := d.Headers[HeaderPayloadHash].(string)
	if hash, err := hex.DecodeString(hexHash); err == nil && len(hash) == len(idem.Hash{}) {
		var why *string
		if s, ok := d.Headers[HeaderReason].(string); ok {
			why = &s
		}
		var at time.Time
		var id string
		err := r.o.Pool.QueryRow(ctx, r.entry, consumer, hash, why).Scan(&at, &id)
		switch {
		case err == nil:
			return at, id, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return time.Time{}, "", fmt.Errorf("deadletters: redrive: read the dead-letter row of %q: %w", d.MessageId, err)
		}
	}
	if deaths, ok := d.Headers["x-death"].([]any); ok {
		for _, death := range deaths {
			if t, ok := death.(amqp.Table); ok {
				if at, ok := t["time"].(time.Time); ok {
					return at, d.MessageId, nil
				}
			}
		}
	}
	return time.Time{}, "", fmt.Errorf("%w: message %q carries no dead-letter row nor x-death time: when it entered %s is unknown",
		inbox.ErrBeyondHorizon, d.MessageId, r.o.DeadLetterQueue)
}
