package streamio

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/streamclient/amqp"
	"github.com/idemkit/idem/internal/streamclient/stream"
)

// DefaultMaxBatch is the batch size limit used when none is given.
const DefaultMaxBatch = 256

// credits is how many chunks the broker may send ahead of the consumer. The
// client grants one more when half of a chunk has been handed over, so at
// most this many chunks plus one batch of records are held in memory while
// fn is slow.
const credits = 4

// ErrConnectionLost is returned (wrapped) by Read and Follow when the
// subscription ends without being asked to (the connection dropped, the
// stream was deleted or its leader moved) or stops delivering records the
// stream holds. Resume from the last offset you committed.
var ErrConnectionLost = errors.New("streamio: subscription closed by the broker or the network")

// buffer hands records from the client's dispatch goroutine to the reading
// goroutine. put blocks while the buffer is full, which stops the client
// from granting credit, which stops the broker: memory stays bounded however
// slow the reader is.
type buffer struct {
	mu      sync.Mutex
	space   *sync.Cond
	recs    []Record
	spare   []Record
	limit   int
	stopped bool
	ready   chan struct{} // holds a token while recs is not empty
}

func newBuffer(limit int) *buffer {
	b := &buffer{
		recs:  make([]Record, 0, limit),
		spare: make([]Record, 0, limit),
		limit: limit,
		ready: make(chan struct{}, 1),
	}
	b.space = sync.NewCond(&b.mu)
	return b
}

// put appends r, waiting for room. It drops r once the buffer is stopped.
func (b *buffer) put(r Record) {
	b.mu.Lock()
	for len(b.recs) >= b.limit && !b.stopped {
		b.space.Wait()
	}
	if !b.stopped {
		b.recs = append(b.recs, r)
		if len(b.recs) == 1 {
			select {
			case b.ready <- struct{}{}:
			default:
			}
		}
	}
	b.mu.Unlock()
}

// take returns every buffered record (at most limit). The returned slice is
// reused by the take after next.
func (b *buffer) take() []Record {
	b.mu.Lock()
	out := b.recs
	b.recs, b.spare = b.spare[:0], out
	select { // the token may be stale when put raced with a previous take
	case <-b.ready:
	default:
	}
	b.space.Broadcast()
	b.mu.Unlock()
	return out
}

// stop releases a blocked put and makes later ones no-ops.
func (b *buffer) stop() {
	b.mu.Lock()
	b.stopped = true
	b.space.Broadcast()
	b.mu.Unlock()
}

// stallCheck is how long a subscription waits without a record before it
// asks whether one is due, and how long it then waits for that record before
// it presumes itself lost (subscription.next).
const stallCheck = 10 * time.Second

// subscription is one consumer feeding a buffer.
type subscription struct {
	consumer *stream.Consumer
	buf      *buffer
	closed   stream.ChannelClose
	// want is the offset of the next record expected.
	want int64
	// stall is how long next waits before it asks backlog.
	stall time.Duration
	// backlog reports whether the stream holds the record at offset want:
	// a subscription that then delivers nothing is lost.
	backlog func(ctx context.Context, want int64) bool
}

// subscribe starts a consumer on streamName at spec, expecting offset from
// first. Records reach the buffer in offset order.
func (e *Env) subscribe(ctx context.Context, env *stream.Environment, streamName string, spec stream.OffsetSpecification, from int64, limit int, backlog func(context.Context, int64) bool) (*subscription, error) {
	buf := newBuffer(limit)
	handler := func(cc stream.ConsumerContext, m *amqp.Message) {
		buf.put(toRecord(cc.Consumer.GetOffset(), m))
	}
	opts := stream.NewConsumerOptions().
		SetOffset(spec).
		SetInitialCredits(credits).
		SetClientProvidedName("idem-streamio")
	c, err := e.newConsumer(ctx, env, streamName, handler, opts)
	if err != nil {
		return nil, err
	}
	return &subscription{consumer: c, buf: buf, closed: c.NotifyClose(), want: from, stall: e.stall, backlog: backlog}, nil
}

// newConsumer creates a consumer, giving up when ctx ends; a consumer the
// client creates after that is closed right away.
func (e *Env) newConsumer(ctx context.Context, env *stream.Environment, streamName string, h stream.MessagesHandler, opts *stream.ConsumerOptions) (*stream.Consumer, error) {
	type result struct {
		c   *stream.Consumer
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := env.NewConsumer(streamName, h, opts)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("subscribe: %w", r.err)
		}
		if e.subscribed != nil {
			e.subscribed(r.c)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.c != nil {
				_ = r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// close stops the handler first (it may be blocked in put) and then the
// consumer.
func (s *subscription) close() {
	s.buf.stop()
	_ = s.consumer.Close()
}

// next waits for buffered records, the end of the subscription or ctx.
//
// The client reports a close only to a handler registered before it, and
// NotifyClose can be called only once the consumer exists: a close in
// between (the socket dropped, the stream's leader moved) is never reported.
// So a wait that lasts s.stall asks s.backlog whether the stream holds the
// record expected next; when it does and that record still does not come
// within another s.stall, the subscription is lost.
func (s *subscription) next(ctx context.Context) ([]Record, error) {
	timer := time.NewTimer(s.stall)
	defer timer.Stop()
	behind := false
	for {
		select {
		case <-s.buf.ready:
			recs := s.buf.take()
			if n := len(recs); n > 0 {
				s.want = recs[n-1].Offset + 1
			}
			return recs, nil
		case ev := <-s.closed:
			return nil, fmt.Errorf("%w: %s", ErrConnectionLost, ev.Reason)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			if behind {
				return nil, fmt.Errorf("%w: offset %d is in the stream but was not delivered", ErrConnectionLost, s.want)
			}
			behind = s.backlog(ctx, s.want)
			timer.Reset(s.stall)
		}
	}
}
