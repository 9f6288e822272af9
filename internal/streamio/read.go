package streamio

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/streamclient/amqp"
	"github.com/idemkit/idem/internal/streamclient/stream"
)

// Tail returns the offset of the last record committed to streamName now;
// ok is false for an empty stream. The broker has no call for this before
// RabbitMQ 3.11, so Tail subscribes at the last chunk with a single credit
// and reads that chunk's highest offset. An empty stream delivers nothing:
// Tail waits Config.ProbeTimeout before it says so.
//
// When the last chunk was written with sub-entry batching (several records
// per entry), Tail may return an offset inside that chunk instead of its
// last: still a committed record, so still a sound end for a bounded read.
func (e *Env) Tail(ctx context.Context, streamName string) (last int64, ok bool, err error) {
	env, err := e.connect(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("streamio: tail of %s: %w", streamName, err)
	}
	defer e.disconnect(env)
	last, ok, err = e.tail(ctx, env, streamName)
	if err != nil {
		return 0, false, fmt.Errorf("streamio: %s: %w", streamName, err)
	}
	return last, ok, nil
}

func (e *Env) tail(ctx context.Context, env *stream.Environment, streamName string) (last int64, ok bool, err error) {
	_, last, ok, err = e.probe(ctx, env, streamName, stream.OffsetSpecification{}.Last(), true)
	if err != nil {
		return 0, false, fmt.Errorf("tail: %w", err)
	}
	return last, ok, nil
}

// firstAtOrAfter returns the first offset of the first chunk the broker
// stored at or after ms (Unix milliseconds); ok is false when there is none.
func (e *Env) firstAtOrAfter(ctx context.Context, env *stream.Environment, streamName string, ms int64) (first int64, ok bool, err error) {
	first, _, ok, err = e.probe(ctx, env, streamName, stream.OffsetSpecification{}.Timestamp(ms), false)
	if err != nil {
		return 0, false, fmt.Errorf("find time %s: %w", time.UnixMilli(ms).UTC().Format(time.RFC3339Nano), err)
	}
	return first, ok, nil
}

// probe subscribes at spec with one credit, so the broker sends a single
// chunk, and returns the first and last offsets seen: of the first message
// only, or of the whole chunk when wholeChunk is set. ok is false when no
// chunk came within ProbeTimeout, twice: a consumer closed before probeOnce
// registered for its close notification delivers nothing and reports
// nothing, just like a stream with no chunk there.
func (e *Env) probe(ctx context.Context, env *stream.Environment, streamName string, spec stream.OffsetSpecification, wholeChunk bool) (first, last int64, ok bool, err error) {
	for range 2 {
		if first, last, ok, err = e.probeOnce(ctx, env, streamName, spec, wholeChunk); ok || err != nil {
			break
		}
	}
	return first, last, ok, err
}

func (e *Env) probeOnce(ctx context.Context, env *stream.Environment, streamName string, spec stream.OffsetSpecification, wholeChunk bool) (first, last int64, ok bool, err error) {
	var (
		mu       sync.Mutex
		seen     int
		lo, hi   int64
		done     bool
		finished = make(chan struct{})
	)
	handler := func(cc stream.ConsumerContext, _ *amqp.Message) {
		off := cc.Consumer.GetOffset()
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if seen == 0 {
			lo, hi = off, off
		}
		hi = max(hi, off)
		seen++
		if !wholeChunk || seen >= int(cc.GetEntriesCount()) {
			done = true
			close(finished)
		}
	}
	opts := stream.NewConsumerOptions().
		SetOffset(spec).
		SetCreditStrategy(stream.ManualCreditStrategy).
		SetInitialCredits(1).
		SetClientProvidedName("idem-streamio-probe")
	c, err := e.newConsumer(ctx, env, streamName, handler, opts)
	if err != nil {
		return 0, 0, false, err
	}
	defer func() { _ = c.Close() }()
	closed := c.NotifyClose()
	timer := time.NewTimer(e.cfg.ProbeTimeout)
	defer timer.Stop()
	select {
	case <-finished:
	case <-timer.C:
	case ev := <-closed:
		return 0, 0, false, fmt.Errorf("%w: %s", ErrConnectionLost, ev.Reason)
	case <-ctx.Done():
		return 0, 0, false, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	// After a timeout, what was seen of a chunk is still committed.
	done = true
	return lo, hi, seen > 0, nil
}

// Read reads the range spec describes and returns once its last record has
// been handed to fn, or at the first error. The end is fixed when Read
// starts: records appended meanwhile are not read, and Read stops by itself
// (streams have no end-of-stream signal).
//
// fn receives batches of consecutive records in offset order: what is
// already buffered, at most spec.MaxBatch. It runs on the goroutine that
// called Read, one batch at a time, so it may run a database transaction per
// batch; while it runs, the broker is held back by flow control. The slice is
// reused after fn returns: keep the records, not the slice. An error from fn
// ends the read and is returned as is.
//
// A spec that cannot describe a range returns an error wrapping
// ErrInvalidSpec, ErrEndBeforeStart or ErrStartInFuture. An empty range (an
// empty stream, a start past the tail) returns nil without calling fn.
func (e *Env) Read(ctx context.Context, spec ReadSpec, fn func(ctx context.Context, batch []Record) error) error {
	spec, err := spec.validate(time.Now())
	if err != nil {
		return err
	}
	env, err := e.connect(ctx)
	if err != nil {
		return fmt.Errorf("streamio: read %s: %w", spec.Stream, err)
	}
	defer e.disconnect(env)
	w, start, err := e.resolve(ctx, env, spec)
	if err != nil {
		return fmt.Errorf("streamio: read %s: %w", spec.Stream, err)
	}
	if w.empty() {
		e.logger.Debug("streamio: empty range", slog.String("stream", spec.Stream),
			slog.String("from", spec.From.String()), slog.String("to", spec.To.String()))
		return nil
	}
	// Until Read is done, the record it waits for is in the stream.
	due := func(context.Context, int64) bool { return true }
	sub, err := e.subscribe(ctx, env, spec.Stream, start, w.from, spec.MaxBatch, due)
	if err != nil {
		return fmt.Errorf("streamio: read %s: %w", spec.Stream, err)
	}
	defer sub.close()
	for {
		batch, err := sub.next(ctx)
		if err != nil {
			return fmt.Errorf("streamio: read %s: %w", spec.Stream, err)
		}
		keep, done := w.cut(batch)
		if len(keep) > 0 {
			if err := fn(ctx, keep); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// resolve turns spec into offsets, asking the broker for the tail and for
// the chunks at the requested times. An empty window means nothing to read.
func (e *Env) resolve(ctx context.Context, env *stream.Environment, spec ReadSpec) (window, stream.OffsetSpecification, error) {
	nothing := window{from: 1, end: 0}
	started := time.Now()
	tail, ok, err := e.tail(ctx, env, spec.Stream)
	if err != nil || !ok {
		return nothing, stream.OffsetSpecification{}, err
	}
	w := window{end: tail}
	switch spec.To.kind {
	case PositionOffset:
		w.end = min(w.end, spec.To.offset)
	case PositionTime:
		w.notAfter = spec.To.time
		if spec.To.time.Before(started) {
			// The first chunk stored after the end time bounds the range.
			after, found, err := e.firstAtOrAfter(ctx, env, spec.Stream, spec.To.time.UnixMilli()+1)
			if err != nil {
				return nothing, stream.OffsetSpecification{}, err
			}
			if found {
				w.end = min(w.end, after-1)
			}
		}
	}
	var start stream.OffsetSpecification
	switch spec.From.kind {
	case PositionFirst:
		start = stream.OffsetSpecification{}.First()
	case PositionOffset:
		w.from = spec.From.offset
		start = stream.OffsetSpecification{}.Offset(w.from)
	case PositionTime:
		w.notBefore = spec.From.time
		first, found, err := e.firstAtOrAfter(ctx, env, spec.Stream, spec.From.time.UnixMilli())
		if err != nil || !found {
			return nothing, stream.OffsetSpecification{}, err
		}
		w.from = first
		start = stream.OffsetSpecification{}.Offset(first)
	}
	return w, start, nil
}

// Follow reads streamName from offset from (the first offset delivered) on,
// without end, handing batches to fn the way Read does. It returns nil when
// ctx is cancelled, fn's error as is, or an error wrapping ErrConnectionLost
// when the subscription drops or stops delivering (records are in the
// stream but none came for 20 to 30 seconds): reconnect and resume after
// your last committed offset. A from past the tail waits for that record.
func (e *Env) Follow(ctx context.Context, streamName string, from int64, maxBatch int, fn func(ctx context.Context, batch []Record) error) error {
	if from < 0 || maxBatch < 0 || streamName == "" {
		return fmt.Errorf("%w: follow %q from %d, batch %d", ErrInvalidSpec, streamName, from, maxBatch)
	}
	if maxBatch == 0 {
		maxBatch = DefaultMaxBatch
	}
	env, err := e.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("streamio: follow %s: %w", streamName, err)
	}
	defer e.disconnect(env)
	due := func(ctx context.Context, want int64) bool {
		ctx, cancel := context.WithTimeout(ctx, e.stall)
		defer cancel()
		tail, ok, err := e.tail(ctx, env, streamName)
		return err == nil && ok && tail >= want
	}
	sub, err := e.subscribe(ctx, env, streamName, stream.OffsetSpecification{}.Offset(from), from, maxBatch, due)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("streamio: follow %s: %w", streamName, err)
	}
	defer sub.close()
	w := window{from: from, end: maxOffset}
	for {
		batch, err := sub.next(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("streamio: follow %s: %w", streamName, err)
		}
		if keep, _ := w.cut(batch); len(keep) > 0 {
			if err := fn(ctx, keep); err != nil {
				return err
			}
		}
	}
}

const maxOffset = int64(^uint64(0) >> 1)
