package deadletters

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/amqpconn"
)

// RedriveOptions say which dead-lettered messages Redrive moves back. AMQPURL,
// Pool and Queue are required; the filters are optional and combine with AND.
type RedriveOptions struct {
	// AllowBeyondHorizon moves messages even when they may have lost their
	// inbox row (see Redrive): the consumer will apply them as new. Only
	// for messages you know were never applied. Default: false.
	AllowBeyondHorizon bool
	// AMQPURL is the broker, amqp://user:password@host:5672/vhost.
	// Required; the command line reads IDEM_AMQP_URL.
	AMQPURL string
	// Consumer moves only messages this consumer dead-lettered (their
	// x-idem-consumer header). Default: any.
	Consumer string
	// DeadLetterQueue is where the messages are. Default: Queue+".dlq", the
	// consumer's default (consumer.Config.DeadLetterQueue).
	DeadLetterQueue string
	// Limit is the most messages moved. Default: 0, every matching message.
	Limit int
	// MessageID moves only messages with this message-id property. Default:
	// any.
	MessageID string
	// Operator says who redrives, for the dead-letter rows and the history.
	// Default: "" (unknown).
	Operator string
	// Pool is the database holding the dead-letter rows Redrive marks.
	// Required.
	Pool *pgxpool.Pool
	// Queue is where the messages go back to, through the default exchange.
	// It must exist. Required.
	Queue string
	// Reason moves only messages dead-lettered for this reason (x-idem-reason,
	// or the broker's own reason such as delivery_limit). Default: any.
	Reason string
	// Tables says where the dead-letter table lives. Default: idem's defaults.
	Tables idem.Tables

	// afterConfirm, when set, runs after a chunk's confirms and before its
	// rows are marked and its messages acked (tests cut the connection here).
	afterConfirm func()
	// brokerTimeout, when set, replaces brokerTimeout (tests shorten it).
	brokerTimeout time.Duration
}

// RedriveResult says what Redrive did.
type RedriveResult struct {
	// Scanned is how many dead-letter queue messages were looked at.
	Scanned int
	// Moved is how many were published back to the queue, confirmed by the
	// broker, and removed from the dead-letter queue.
	Moved int
	// Marked is how many dead-letter rows were marked redriven. Messages
	// the broker dead-lettered itself (delivery_limit) have no row.
	Marked int
	// Refused is how many matching messages stayed in the dead-letter
	// queue because they entered it no later than the consumer's inbox
	// horizon (or when that cannot be told): Redrive then returns an error
	// wrapping inbox.ErrBeyondHorizon.
	Refused int
}

// ErrNotMoved means the broker refused a message Redrive published back
// (a negative confirm, or the queue could not route it). That message and
// the ones not reached yet stay in the dead-letter queue.
var ErrNotMoved = errors.New("deadletters: the broker did not take a redriven message")

// redriveChunk is how many matching messages are published before their
// confirms are awaited.
const redriveChunk = 64

// confirmTimeout bounds the wait for one chunk's confirms.
const confirmTimeout = 30 * time.Second

// brokerTimeout bounds the connect and handshake, each write to the broker,
// each wait for its answer to a method (queue.declare, basic.get, ...) and
// the connection's close. RabbitMQ blocks a publishing connection during a
// memory or disk alarm: it stops reading but keeps sending heartbeats.
const brokerTimeout = 30 * time.Second

// Redrive moves the dead-lettered messages that match opts from the
// dead-letter queue back to opts.Queue, each with its body, properties and
// message id; idem's reason headers move into the history header (see
// HistoryHeader), so the consumer starts the message afresh at attempt 1.
//
// A message leaves the dead-letter queue only after the broker confirmed its
// copy in the queue and its dead-letter row was marked (redriven_at,
// redriven_by): a failure or a crash at any point leaves it in the
// dead-letter queue, at worst with a copy already in the queue, which the
// consumer's inbox recognises. Messages that do not match stay where they
// are, in their order. Redrive looks at most at the messages the dead-letter
// queue held when it started, so it ends even while messages keep arriving.
//
// A message that entered the dead-letter queue no later than the newest
// sighting the consumer's inbox retention forgot (inbox.Inbox.CheckSeen)
// may have lost the inbox row it would be recognised by; it could be
// applied a second time. Redrive leaves such a message in the dead-letter
// queue, counts it in RedriveResult.Refused, moves the others, and returns
// an error wrapping inbox.ErrBeyondHorizon that names the horizon. The same
// holds for a message whose consumer (x-idem-consumer, else
// opts.Consumer) or dead-lettering time cannot be told.
// opts.AllowBeyondHorizon moves them anyway.
//
// Every broker call is bounded in time, and when ctx ends Redrive closes
// its connection and returns ctx's cause at once: the messages not acked by
// then stay in the dead-letter queue.
func Redrive(ctx context.Context, opts RedriveOptions) (RedriveResult, error) {
	if opts.DeadLetterQueue == "" {
		opts.DeadLetterQueue = opts.Queue + ".dlq"
	}
	switch {
	case opts.AMQPURL == "", opts.Pool == nil, opts.Queue == "":
		return RedriveResult{}, errors.New("deadletters: redrive: AMQPURL, Pool and Queue are required")
	case opts.Limit < 0:
		return RedriveResult{}, errors.New("deadletters: redrive: Limit must not be negative")
	case opts.DeadLetterQueue == opts.Queue:
		return RedriveResult{}, errors.New("deadletters: redrive: Queue and DeadLetterQueue are the same queue")
	}
	ib, err := inbox.New(inbox.Config{Tables: opts.Tables})
	if err != nil {
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w", err)
	}
	timeout := brokerTimeout
	if opts.brokerTimeout > 0 {
		timeout = opts.brokerTimeout
	}
	conn, err := amqpconn.Dial(ctx, opts.AMQPURL, "idem-redrive", timeout)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: dial %s: %w", redact(opts.AMQPURL), scrub(err, opts.AMQPURL))
	}
	// Closing the connection hands every message still unacked (those that
	// did not match, or whose move failed) back to the dead-letter queue.
	defer func() { _ = conn.Close() }()
	r := &redrive{o: opts, conn: conn, ib: ib, mark: markSQL(opts.Tables), entry: enteredSQL(opts.Tables)}
	if err := r.open(); err != nil {
		return RedriveResult{}, err
	}
	if err := r.scan(ctx); err != nil {
		return r.res, err
	}
	if r.refused != nil {
		return r.res, fmt.Errorf("deadletters: redrive: %d messages left in %s, the first: %w",
			r.res.Refused, opts.DeadLetterQueue, r.refused)
	}
	return r.res, nil
}

// redrive is the state of one Redrive call. Every wait on the broker goes
// through conn.Call, which bounds it and ends it with the context.
type redrive struct {
	o       RedriveOptions
	conn    *amqpconn.Conn
	in, out *amqp.Channel
	returns chan amqp.Return
	depth   int
	ib      *inbox.Inbox
	mark    string
	entry   string // enteredSQL
	res     RedriveResult
	refused error // why the first refused message stayed
}

// open checks both queues and opens the get and the confirm-mode publish
// channels.
func (r *redrive) open() error {
	for _, q := range []string{r.o.Queue, r.o.DeadLetterQueue} {
		ch, err := r.channel()
		if err != nil {
			return err
		}
		var info amqp.Queue
		if err := r.conn.Call(func() (err error) {
			info, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
			return err
		}); err != nil {
			return fmt.Errorf("deadletters: redrive: queue %s: %w", q, err)
		}
		_ = r.conn.Call(ch.Close)
		if q == r.o.DeadLetterQueue {
			r.depth = info.Messages
		}
	}
	var err error
	if r.in, err = r.channel(); err != nil {
		return err
	}
	if r.out, err = r.channel(); err != nil {
		return err
	}
	if err := r.conn.Call(func() error { return r.out.Confirm(false) }); err != nil {
		return fmt.Errorf("deadletters: redrive: confirm mode: %w", err)
	}
	r.returns = r.out.NotifyReturn(make(chan amqp.Return, redriveChunk))
	return nil
}

// channel opens a channel.
func (r *redrive) channel() (ch *amqp.Channel, err error) {
	err = r.conn.Call(func() error {
		ch, err = r.conn.Channel()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("deadletters: redrive: open channel: %w", err)
	}
	return ch, nil
}

// scan gets the dead-letter queue's messages one by one, up to its depth at
// the start, and moves the matching ones in chunks. Non-matching messages
// stay unacked until the connection closes, so each is looked at once.
func (r *redrive) scan(ctx context.Context) error {
	var chunk []amqp.Delivery
	for r.res.Scanned < r.depth && (r.o.Limit == 0 || r.res.Moved+len(chunk) < r.o.Limit) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("deadletters: redrive: %w", err)
		}
		var d amqp.Delivery
		var ok bool
		err := r.conn.Call(func() (err error) {
			d, ok, err = r.in.Get(r.o.DeadLetterQueue, false)
			return err
		})
		if err != nil {
			return fmt.Errorf("deadletters: redrive: get from %s: %w", r.o.DeadLetterQueue, err)
		}
		if !ok {
			break
		}
		r.res.Scanned++
		if !r.o.matches(d) {
			continue
		}
		if err := r.beyondHorizon(ctx, d); err != nil {
			if !errors.Is(err, inbox.ErrBeyondHorizon) {
				return err
			}
			r.res.Refused++
			if r.refused == nil {
				r.refused = err
			}
			continue
		}
		if chunk = append(chunk, d); len(chunk) == redriveChunk {
			if err := r.move(ctx, chunk); err != nil {
				return err
			}
			chunk = chunk[:0]
		}
	}
	return r.move(ctx, chunk)
}

// move publishes a chunk back to the queue, waits for its confirms, marks
// the dead-letter rows in one transaction and only then acks the chunk in
// the dead-letter queue.
func (r *redrive) move(ctx context.Context, chunk []amqp.Delivery) error {
	if len(chunk) == 0 {
		return nil
	}
	now := time.Now()
	confirms := make([]*amqp.DeferredConfirmation, len(chunk))
	for i, d := range chunk {
		p := republish(d, redriveHeaders(d.Headers, now, r.o.Operator, r.o.DeadLetterQueue))
		var dc *amqp.DeferredConfirmation
		err := r.conn.Call(func() (err error) {
			dc, err = r.out.PublishWithDeferredConfirmWithContext(ctx, "", r.o.Queue, true, false, p)
			return err
		})
		if err != nil {
			return fmt.Errorf("deadletters: redrive: publish to %s: %w", r.o.Queue, err)
		}
		confirms[i] = dc
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	for _, dc := range confirms {
		acked, err := dc.WaitContext(cctx)
		if err != nil {
			return fmt.Errorf("deadletters: redrive: confirm from %s: %w", r.o.Queue, err)
		}
		if !acked && r.out.IsClosed() { // the client nacks what was pending when the channel closed
			return fmt.Errorf("deadletters: redrive: confirm from %s: %w", r.o.Queue, r.closed())
		}
		if !acked {
			return fmt.Errorf("%w: %s refused a message (negative confirm)", ErrNotMoved, r.o.Queue)
		}
	}
	// A return precedes the confirm of the same message, so the returns of
	// this chunk are queued by now.
	select {
	case ret, open := <-r.returns:
		if open { // closed: the channel ended after every confirm, nothing returned
			return fmt.Errorf("%w: %s could not route it: %s", ErrNotMoved, r.o.Queue, ret.ReplyText)
		}
	default:
	}
	if r.o.afterConfirm != nil {
		r.o.afterConfirm()
	}
	// Cancelled or cut off: the acks cannot go out, so the rows stay
	// unmarked too, as their messages stay in the dead-letter queue.
	if err := r.conn.Err(); err != nil {
		return fmt.Errorf("deadletters: redrive: before marking rows: %w", err)
	}
	marked, err := r.markRows(ctx, chunk)
	if err != nil {
		return err
	}
	for _, d := range chunk {
		if err := r.conn.Call(func() error { return d.Ack(false) }); err != nil {
			return fmt.Errorf("deadletters: redrive: ack in %s: %w", r.o.DeadLetterQueue, err)
		}
	}
	r.res.Moved += len(chunk)
	r.res.Marked += marked
	return nil
}

// closed says why the publish channel closed: ctx ended, the connection
// closed, or the broker closed the channel.
func (r *redrive) closed() error {
	if err := r.conn.Err(); err != nil {
		return err
	}
	return amqp.ErrClosed
}

// markRows marks, for each message of chunk, the oldest unmarked dead-letter
// row of its consumer and payload (and reason): the row its dead-lettering
// wrote. It runs in one transaction detached from cancellation, so that the
// chunk's rows are marked all or none.
func (r *redrive) markRows(ctx context.Context, chunk []amqp.Delivery) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	marked := 0
	err := pgx.BeginFunc(ctx, r.o.Pool, func(tx pgx.Tx) error {
		for _, d := range chunk {
			consumer, _ := d.Headers[headerConsumer].(string)
			hexHash, _ := d.Headers[headerPayloadHash].(string)
			hash, err := hex.DecodeString(hexHash)
			if consumer == "" || err != nil || len(hash) != len(idem.Hash{}) {
				continue // dead-lettered by the broker itself: no row
			}
			var why *string
			if s, ok := d.Headers[headerReason].(string); ok {
				why = &s
			}
			tag, err := tx.Exec(ctx, r.mark, consumer, hash, why, r.o.Operator)
			if err != nil {
				return err
			}
			marked += int(tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("deadletters: redrive: mark rows: %w", err)
	}
	return marked, nil
}

// markSQL marks the oldest unmarked row of (consumer $1, payload hash $2,
// reason $3 when given) as redriven by $4.
func markSQL(t idem.Tables) string {
	dl := t.WithDefaults().Table("dead_letters")
	return `UPDATE ` + dl + ` SET redriven_at = now(), redriven_by = NULLIF($4::text, '')
WHERE id = (SELECT id FROM ` + dl + `
	WHERE consumer = $1 AND payload_hash = $2 AND ($3::text IS NULL OR reason = $3::text) AND redriven_at IS NULL
	ORDER BY id LIMIT 1 FOR UPDATE)`
}

// scrub replaces the password of raw in err's text, for errors that quote
// the URL (the client's parse errors do); other errors are returned as they
// are.
func scrub(err error, raw string) error {
	at := strings.LastIndex(raw, "@")
	scheme := strings.Index(raw, "://")
	if at < 0 || scheme < 0 || scheme+3 > at {
		return err
	}
	_, pw, ok := strings.Cut(raw[scheme+3:at], ":")
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

// redact hides the password of a URL for errors.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable url>"
	}
	return u.Redacted()
}
