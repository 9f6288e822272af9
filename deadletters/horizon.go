package deadletters

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
)

// A message that sat in the dead-letter queue longer than the consumer's
// inbox retention may have lost the row it would be recognised by: a
// payload conflict whose original was applied, a copy of a message
// processed meanwhile. Redrive asks the consumer's inbox horizon
// (inbox.Inbox.CheckSeen) with the time the message entered the dead-letter
// queue, and leaves in the queue every message that entered it no later
// than the newest sighting retention forgot, or whose consumer or entry
// time cannot be told. Before it asks, it touches the message's own inbox
// row (inbox.Inbox.Touch, by the consumer and id of match.go), so that a
// clean-up running meanwhile either deletes the row first, and records the
// horizon that refuses the message, or leaves it to outlive the message's
// trip back.

// maxRefusals bounds RedriveResult.Refusals; Refused counts every one.
const maxRefusals = 100

// Refusal is a message Redrive left in the dead-letter queue because it
// could come back without its inbox row, or because that cannot be told.
type Refusal struct {
	// MessageID is the id its rows are matched by (see Redrive); "" when
	// it has none.
	MessageID string
	// Consumer is the consumer it was judged for; "" when nothing named
	// one.
	Consumer string
	// Reason is why it was dead-lettered (x-idem-reason, or the broker's).
	Reason string
	// Err says why it stayed. It wraps inbox.ErrBeyondHorizon, and is an
	// *inbox.HorizonError when its time was judged against the horizon.
	Err error
}

// admit returns nil when the message l, taken as d, may go back, or an
// error wrapping inbox.ErrBeyondHorizon that says why not. It first finds
// l's own dead-letter row (besides the rows taken by the chunk in hand),
// which Redrive marks and which says when l entered, and touches l's own
// inbox row.
func (r *redrive) admit(ctx context.Context, l *letter, d amqp.Delivery, taken []int64) error {
	if l.consumer == "" {
		if r.o.AllowBeyondHorizon {
			return nil
		}
		return fmt.Errorf("%w: message %q names no consumer: the broker dead-lettered it (x-death), or it is not idem's; "+
			"pass its consumer (RedriveOptions.Consumer, --consumer) to judge it against that consumer's inbox horizon",
			inbox.ErrBeyondHorizon, l.id)
	}
	if err := r.findRow(ctx, l, d, taken); err != nil {
		return err
	}
	if _, err := r.ib.Touch(ctx, r.o.Pool, l.consumer, l.id); err != nil {
		return fmt.Errorf("deadletters: redrive: %w", err)
	}
	if r.o.AllowBeyondHorizon {
		return nil
	}
	at := l.entered()
	switch {
	case at.IsZero() && l.own():
		return fmt.Errorf("%w: no dead-letter row of consumer %q is left for message %q (%s) with its payload: "+
			"retention deleted it, or a redrive marked it, so when it entered %s cannot be told",
			inbox.ErrBeyondHorizon, l.consumer, l.id, l.reason, r.o.DeadLetterQueue)
	case at.IsZero():
		return fmt.Errorf("%w: message %q carries no x-death time and no dead-letter row of consumer %q records it: "+
			"when it entered %s cannot be told", inbox.ErrBeyondHorizon, l.id, l.consumer, r.o.DeadLetterQueue)
	}
	if err := r.ib.CheckSeen(ctx, r.o.Pool, l.consumer, at); err != nil {
		return fmt.Errorf("message %q entered %s at %s: %w", l.id, r.o.DeadLetterQueue, at.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// refuse counts l as refused for err, and keeps the first refusals.
func (r *redrive) refuse(l letter, err error) {
	r.res.Refused++
	if r.refused == nil {
		r.refused = err
	}
	if len(r.res.Refusals) < maxRefusals {
		r.res.Refusals = append(r.res.Refusals, Refusal{MessageID: l.id, Consumer: l.consumer, Reason: l.reason, Err: err})
	}
}
