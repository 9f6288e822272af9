package deadletters

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/amqpurl"
)

// RedriveOptions say which dead-lettered messages Redrive moves back. The
// broker (AMQPURL or AMQPURLs), Pool and Queue are required; the filters are
// optional and combine with AND.
type RedriveOptions struct {
	// AllowBeyondHorizon moves messages even when they may have lost their
	// inbox row (see Redrive): the consumer will apply them as new. Only
	// for messages you know were never applied. Default: false.
	AllowBeyondHorizon bool
	// AMQPURL is the broker, amqp://user:password@host:5672/vhost, when it
	// is one node. Set it or AMQPURLs; the command line reads IDEM_AMQP_URL.
	AMQPURL string
	// AMQPURLs are the nodes of a cluster, one URL each: Redrive dials them
	// in a shuffled order and uses the first that answers.
	AMQPURLs []string
	// Consumer moves only messages this consumer dead-lettered (their
	// x-idem-consumer header), and is the consumer a message the broker
	// dead-lettered itself (delivery_limit) is judged for: such a message
	// names none, and without Consumer it is refused. Default: any.
	Consumer string
	// DeadLetterQueue is where the messages are. Default: QueueName(Queue),
	// the consumer's default (consumer.Config.DeadLetterQueue).
	DeadLetterQueue string
	// Limit is the most messages moved. Default: 0, every matching message.
	Limit int
	// MessageID moves only the message with this id: the one its
	// dead-letter row records (List), which idem's copy carries in
	// HeaderMessageID, or the message-id property of a message the broker
	// dead-lettered itself. Default: any.
	MessageID string
	// Operator says who redrives, for the dead-letter rows and the history.
	// Default: "" (unknown).
	Operator string
	// Pool is the database holding the dead-letter rows Redrive marks.
	// Required.
	Pool *pgxpool.Pool
	// Queue is where the messages go back to, through the default exchange.
	// It must exist. For a partitioned consumer (consumer.Config.Partitions)
	// it is the consumer's Queue, its exchange: each message goes back to
	// the partition of its key (through the exchange by the routing key it
	// was delivered with; a message last delivered from its partition's
	// retry queue, straight to that partition). Required.
	Queue string
	// Reason moves only messages dead-lettered for this reason (x-idem-reason,
	// or for a message the broker dead-lettered itself its newest x-death
	// reason, such as delivery_limit). Default: any.
	Reason string
	// Tables says where the dead-letter table lives. Default: idem's defaults.
	Tables idem.Tables

	// afterConfirm, when set, runs after a chunk's confirms and before its
	// rows are marked and its messages acked (tests cut the connection here).
	afterConfirm func()
	// brokerTimeout, when set, replaces brokerTimeout (tests shorten it).
	brokerTimeout time.Duration
}

// QueueName is the dead-letter queue of a consumer of queue unless its
// Config.DeadLetterQueue names another: the queue's name and .dlq
// (payments.dlq for payments). A partitioned consumer's partitions share
// it.
func QueueName(queue string) string { return amqpnames.DeadLetterQueue(queue) }

// RedriveResult says what Redrive did.
type RedriveResult struct {
	// Scanned is how many dead-letter queue messages were looked at. Those
	// not moved were put back at the dead-letter queue's tail.
	Scanned int
	// Moved is how many were published back to the queue, confirmed by the
	// broker, and removed from the dead-letter queue.
	Moved int
	// Marked is how many dead-letter rows were marked redriven: each moved
	// message's own row (see Redrive). A message the broker dead-lettered
	// itself (delivery_limit) usually has none.
	Marked int
	// Refused is how many matching messages stayed in the dead-letter
	// queue because they entered it no later than the consumer's inbox
	// horizon, or because their consumer or that time cannot be told:
	// Redrive then returns an error wrapping inbox.ErrBeyondHorizon.
	Refused int
	// Refusals are the first 100 refused messages, in queue order, each
	// with why it stayed.
	Refusals []Refusal
}

// ErrNotMoved means the broker refused a copy Redrive published, to the
// queue or back to the dead-letter queue (a negative confirm, or the queue
// could not route it). That message and the ones not reached yet stay in
// the dead-letter queue.
var ErrNotMoved = errors.New("deadletters: the broker did not take a message's copy")

// ErrNoDeadLetterQueue means the dead-letter queue to redrive from does not
// exist, so Redrive moved nothing: a stream, for one, has none (its dead
// letters are retried by a repair replay).
var ErrNoDeadLetterQueue = errors.New("deadletters: redrive: no dead-letter queue")

// redriveChunk is how many messages are taken, and their copies published,
// before the copies' confirms are awaited and the messages acked at once.
// A quorum queue's channel (RabbitMQ 3.10) holds back acks while 32 are
// still unapplied, and drops those it holds when the connection closes:
// their messages come back, delivered once more, beside their copies. The
// acks of a chunk this small go out at once, and the gets of the next
// chunk, each a round trip through the queue, see the previous ones
// applied.
const redriveChunk = 16

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
// Redrive takes messages from the dead-letter queue's head, at most as many
// as it held when Redrive started, so it ends even while messages keep
// arriving. It publishes a matching message to the queue, and any other
// (and a matching one past Limit) back to the dead-letter queue's tail as it
// is: the same body, properties (but user-id, which the broker checks
// against the publishing user) and headers. Once every message was taken,
// those kept are in their order, and none was handed back to the queue, so
// none counts one more delivery (a quorum queue's x-delivery-count). A
// message dead-lettered while Redrive runs is not looked at; it ends up
// behind the kept messages taken before it arrived and ahead of those taken
// after. When Limit messages moved before any was put back, Redrive stops
// there and leaves the rest untouched.
//
// A message leaves the dead-letter queue (is acked) only after the broker
// confirmed its copy and, for a moved message, its own dead-letter row was
// marked (redriven_at, redriven_by): a failure or a crash at any point
// leaves it in the dead-letter queue, at worst with a copy already in the
// queue or at the tail, which the consumer's inbox recognises. Nothing is
// lost, but a Redrive that fails midway leaves the messages it put back so
// far behind those it had not reached.
//
// Redrive matches each message to its own rows by (consumer, message id),
// never by its payload: idem's own copy by its x-idem-consumer and
// HeaderMessageID headers, its dead-letter row also by the reason and
// payload hash it names; a message the broker dead-lettered itself
// (x-death), whose x-idem- headers are its publisher's, by opts.Consumer and
// its message-id property, its row only if that row holds its payload. It
// marks only that row, and touches only that inbox row.
//
// A message that entered the dead-letter queue no later than the newest
// sighting the consumer's inbox retention forgot (inbox.Inbox.CheckSeen)
// may have lost the inbox row it would be recognised by; it could be
// applied a second time. It entered when its own dead-letter row was
// written, or for a message the broker dead-lettered, at its x-death time.
// Redrive leaves such a message in the dead-letter queue, counts it in
// RedriveResult.Refused (and Refusals, with why), moves the others, and
// returns an error wrapping inbox.ErrBeyondHorizon that names the first.
// The same holds for a message whose consumer or entry time cannot be
// told: idem's copy whose row is gone (retention deleted it), a message the
// broker dead-lettered when opts.Consumer is empty. opts.AllowBeyondHorizon
// moves them anyway. Before it asks, Redrive touches the message's inbox
// row (inbox.Inbox.Touch): a cleanup that runs while the message is on its
// way back finds the row too young to delete.
//
// Every broker call is bounded in time, and when ctx ends Redrive closes
// its connection and returns ctx's cause at once: the messages not acked by
// then stay in the dead-letter queue.
func Redrive(ctx context.Context, opts RedriveOptions) (RedriveResult, error) {
	if opts.DeadLetterQueue == "" {
		opts.DeadLetterQueue = QueueName(opts.Queue)
	}
	nodes, err := amqpurl.Nodes(opts.AMQPURL, opts.AMQPURLs)
	switch {
	case err != nil:
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w", err)
	case opts.Pool == nil, opts.Queue == "":
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w: Pool and Queue are required", idem.ErrConfig)
	case opts.Limit < 0:
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w: Limit must not be negative", idem.ErrConfig)
	case opts.DeadLetterQueue == opts.Queue:
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w: Queue and DeadLetterQueue are the same queue", idem.ErrConfig)
	}
	ib, err := inbox.New(inbox.Config{Tables: opts.Tables})
	if err != nil {
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w", err)
	}
	timeout := brokerTimeout
	if opts.brokerTimeout > 0 {
		timeout = opts.brokerTimeout
	}
	conn, err := amqpconn.Dial(ctx, nodes, "idem-redrive", timeout)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("deadletters: redrive: %w", err)
	}
	// Closing the connection hands every message still unacked (the chunk
	// in hand when Redrive failed) back to the dead-letter queue.
	defer func() { _ = conn.Close() }()
	r := &redrive{o: opts, conn: conn, ib: ib, mark: markSQL(opts.Tables), row: rowSQL(opts.Tables)}
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
	mark    string // markSQL
	row     string // rowSQL
	res     RedriveResult
	refused error // why the first refused message stayed
	// exchange is Queue when it names a partitioned consumer's exchange.
	exchange string
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
			if q == r.o.Queue && r.partitioned() {
				continue
			}
			var ae *amqp.Error
			if q == r.o.DeadLetterQueue && errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return fmt.Errorf("%w %s: nothing was moved. If %s is a stream, it has none: a stream's dead letters are "+
					"rows of the dead-letter table only; retry them with a repair replay of their ids "+
					"(WORKER replay --mode repair --id ID …, see docs/streams.md), which marks their rows: %w",
					ErrNoDeadLetterQueue, q, r.o.Queue, err)
			}
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

// partitioned reports whether Queue names a partitioned consumer's
// exchange (consumer.Config.Partitions) rather than a queue; if so, moved
// messages go back through it, each with its original routing key (its
// ordering key), to the partition of its key.
func (r *redrive) partitioned() bool {
	ch, err := r.channel()
	if err != nil {
		return false
	}
	exchange := amqpnames.PartitionExchange(r.o.Queue)
	err = r.conn.Call(func() error {
		return ch.ExchangeDeclarePassive(exchange, amqpnames.PartitionExchangeType, true, false, false, false, nil)
	})
	if err != nil {
		return false
	}
	_ = r.conn.Call(ch.Close)
	r.exchange = exchange
	return true
}

// route is where a taken message's copy goes: the queue through the
// default exchange, or for a partitioned consumer (see partitioned) the
// partition of its key: through the exchange by the routing key it was
// delivered with, or, for a message delivered from its partition's retry
// queue (whose route names the partition queue), straight to that
// partition. A message not moved goes back to the tail of the dead-letter
// queue.
func (r *redrive) route(t taken) (exchange, key string) {
	switch {
	case !t.move:
		return "", r.o.DeadLetterQueue
	case r.exchange == "":
		return "", r.o.Queue
	}
	key, _ = t.d.Headers[HeaderOriginalRoutingKey].(string)
	if amqpnames.IsPartitionQueue(r.o.Queue, key) {
		return "", key
	}
	if key == "" {
		key = t.d.MessageId // no route: some partition, which the inbox serves as well
	}
	return r.exchange, key
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

// taken is a message Redrive got from the dead-letter queue, what it says
// of itself, and where its copy goes: to the queue, or back to the
// dead-letter queue's tail.
type taken struct {
	d    amqp.Delivery
	l    letter
	move bool
}

// scan takes the dead-letter queue's messages from its head, one by one, up
// to its depth at the start, and settles them in chunks: the matching ones
// go to the queue, the others back to the dead-letter queue's tail, so that
// once every message was taken the ones kept are in their order again. Once
// Limit messages move, the scan ends early only while it has put none back:
// the messages not reached are then still in their order, at the head.
func (r *redrive) scan(ctx context.Context) error {
	chunk := make([]taken, 0, redriveChunk)
	moving, kept := 0, 0
	for r.res.Scanned < r.depth && (r.o.Limit == 0 || moving < r.o.Limit || kept > 0) {
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
		t := taken{d: d, l: identify(d, r.o.Queue, r.o.Consumer)}
		t.move = (r.o.Limit == 0 || moving < r.o.Limit) && r.o.matches(t.l)
		if t.move {
			if err := r.admit(ctx, &t.l, d, rows(chunk)); err != nil {
				if !errors.Is(err, inbox.ErrBeyondHorizon) {
					return err
				}
				r.refuse(t.l, err)
				t.move = false // kept in its place, like a message that does not match
			}
		}
		if t.move {
			moving++
		} else {
			kept++
		}
		if chunk = append(chunk, t); len(chunk) == redriveChunk {
			if err := r.settle(ctx, chunk); err != nil {
				return err
			}
			chunk = chunk[:0]
		}
	}
	return r.settle(ctx, chunk)
}

// settle publishes the copies of a chunk's messages, marks the dead-letter
// rows of the moved ones in one transaction and only then acks the chunk's
// messages in the dead-letter queue.
func (r *redrive) settle(ctx context.Context, chunk []taken) error {
	if len(chunk) == 0 {
		return nil
	}
	if err := r.publish(ctx, chunk); err != nil {
		return err
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
	// One ack for the chunk: every message taken before it is acked.
	if err := r.conn.Call(func() error { return chunk[len(chunk)-1].d.Ack(true) }); err != nil {
		return fmt.Errorf("deadletters: redrive: ack in %s: %w", r.o.DeadLetterQueue, err)
	}
	for _, t := range chunk {
		if t.move {
			r.res.Moved++
		}
	}
	r.res.Marked += marked
	return nil
}

// publish publishes a copy of each message of chunk, in order, and waits
// for the broker's confirms: a moved message's copy goes to the queue with
// its history (redriveHeaders), a kept one's to the dead-letter queue's
// tail with the headers it has.
func (r *redrive) publish(ctx context.Context, chunk []taken) error {
	now := time.Now()
	confirms := make([]*amqp.DeferredConfirmation, len(chunk))
	for i, t := range chunk {
		p := republish(t.d, t.d.Headers)
		if t.move {
			p = republish(t.d, redriveHeaders(t.d.Headers, now, r.o.Operator, r.o.DeadLetterQueue))
		}
		exchange, key := r.route(t)
		err := r.conn.Call(func() (err error) {
			confirms[i], err = r.out.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, p)
			return err
		})
		if err != nil {
			return fmt.Errorf("deadletters: redrive: publish to %s: %w", r.to(t), err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	for i, dc := range confirms {
		acked, err := dc.WaitContext(cctx)
		if err != nil {
			return fmt.Errorf("deadletters: redrive: confirm from %s: %w", r.to(chunk[i]), err)
		}
		if !acked && r.out.IsClosed() { // the client nacks what was pending when the channel closed
			return fmt.Errorf("deadletters: redrive: confirm from %s: %w", r.to(chunk[i]), r.closed())
		}
		if !acked {
			return fmt.Errorf("%w: %s refused a message (negative confirm)", ErrNotMoved, r.to(chunk[i]))
		}
	}
	// A return precedes the confirm of the same message, so the returns of
	// this chunk are queued by now.
	select {
	case ret, open := <-r.returns:
		if open { // closed: the channel ended after every confirm, nothing returned
			return fmt.Errorf("%w: %s could not route it: %s", ErrNotMoved, ret.RoutingKey, ret.ReplyText)
		}
	default:
	}
	return nil
}

// to names where a taken message's copy goes, for errors.
func (r *redrive) to(t taken) string {
	if t.move {
		return r.o.Queue
	}
	return r.o.DeadLetterQueue
}

// closed says why the publish channel closed: ctx ended, the connection
// closed, or the broker closed the channel.
func (r *redrive) closed() error {
	if err := r.conn.Err(); err != nil {
		return err
	}
	return amqp.ErrClosed
}
