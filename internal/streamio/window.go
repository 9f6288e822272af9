package streamio

import (
	"errors"
	"fmt"
	"time"
)

type positionKind uint8

const (
	posDefault positionKind = iota // From: First, To: TailAtStart
	posFirst
	posTail
	posOffset
	posTime
)

// Position is a point in a stream that a bounded read starts or ends at:
// First, TailAtStart, Offset or Timestamp. The zero Position means First in
// ReadSpec.From and TailAtStart in ReadSpec.To.
type Position struct {
	kind   positionKind
	offset int64
	time   time.Time
}

// First is the oldest record the stream still holds.
func First() Position { return Position{kind: posFirst} }

// TailAtStart is the last record committed when the read starts. Records
// appended while the read runs are not read.
func TailAtStart() Position { return Position{kind: posTail} }

// Offset is the record at offset n (inclusive at both ends of a range).
func Offset(n int64) Position { return Position{kind: posOffset, offset: n} }

// Timestamp is a point in time. As a start it selects the first chunk the
// broker stored at or after t, minus the records whose creation time is
// before t; as an end, the last chunk stored at or before t, minus the
// records whose creation time is after t. Chunk timestamps have millisecond
// precision and are taken by the broker when it writes the chunk.
func Timestamp(t time.Time) Position { return Position{kind: posTime, time: t} }

// String describes the position for errors and logs.
func (p Position) String() string {
	switch p.kind {
	case posFirst:
		return "first"
	case posTail:
		return "tail"
	case posOffset:
		return fmt.Sprintf("offset %d", p.offset)
	case posTime:
		return "time " + p.time.UTC().Format(time.RFC3339Nano)
	default:
		return "default"
	}
}

// ReadSpec is what a bounded Read reads.
type ReadSpec struct {
	// From is where the read starts: First, Offset or Timestamp. Default:
	// First.
	From Position
	// MaxBatch caps the records handed to fn at once. Default:
	// DefaultMaxBatch.
	MaxBatch int
	// Stream is the stream's name. Required.
	Stream string
	// To is where the read ends, inclusive: TailAtStart, Offset or
	// Timestamp. An end past the tail is cut to the tail when the read
	// starts: a bounded read never waits for records to be appended.
	// Default: TailAtStart.
	To Position
}

// Errors returned (wrapped) by Read for a spec that makes no sense.
var (
	// ErrInvalidSpec means a field of ReadSpec cannot be used: no stream, a
	// negative offset or batch size, TailAtStart as a start, First as an
	// end.
	ErrInvalidSpec = errors.New("streamio: invalid read spec")
	// ErrEndBeforeStart means To is before From.
	ErrEndBeforeStart = errors.New("streamio: read ends before it starts")
	// ErrStartInFuture means From is a time after the read started.
	ErrStartInFuture = errors.New("streamio: read starts in the future")
)

// validate checks what can be checked without the broker and fills the
// defaults.
func (s ReadSpec) validate(now time.Time) (ReadSpec, error) {
	if s.Stream == "" {
		return s, fmt.Errorf("%w: Stream is required", ErrInvalidSpec)
	}
	if s.MaxBatch < 0 {
		return s, fmt.Errorf("%w: MaxBatch %d is negative", ErrInvalidSpec, s.MaxBatch)
	}
	if s.MaxBatch == 0 {
		s.MaxBatch = DefaultMaxBatch
	}
	if s.From.kind == posDefault {
		s.From = First()
	}
	if s.To.kind == posDefault {
		s.To = TailAtStart()
	}
	switch {
	case s.From.kind == posTail:
		return s, fmt.Errorf("%w: From cannot be TailAtStart", ErrInvalidSpec)
	case s.To.kind == posFirst:
		return s, fmt.Errorf("%w: To cannot be First", ErrInvalidSpec)
	case s.From.kind == posOffset && s.From.offset < 0, s.To.kind == posOffset && s.To.offset < 0:
		return s, fmt.Errorf("%w: offsets cannot be negative", ErrInvalidSpec)
	case s.From.kind == posTime && s.From.time.After(now):
		return s, fmt.Errorf("%w: From %s is after now", ErrStartInFuture, s.From)
	case s.From.kind == posOffset && s.To.kind == posOffset && s.To.offset < s.From.offset,
		s.From.kind == posTime && s.To.kind == posTime && s.To.time.Before(s.From.time):
		return s, fmt.Errorf("%w: From %s, To %s", ErrEndBeforeStart, s.From, s.To)
	}
	return s, nil
}

// window is a resolved bounded read: offsets [from, end] and, for records
// that carry a creation time, the times [notBefore, notAfter] (zero: no
// limit).
type window struct {
	from      int64
	end       int64
	notBefore time.Time
	notAfter  time.Time
}

func (w window) empty() bool { return w.from > w.end }

// cut keeps the records of batch that the window admits, in place, and
// reports whether the read is complete: the end offset was reached or passed.
// Records past the end (the rest of the final chunk) are dropped.
func (w window) cut(batch []Record) (keep []Record, done bool) {
	keep = batch[:0]
	for _, r := range batch {
		if r.Offset > w.end {
			return keep, true
		}
		if w.admits(r) {
			keep = append(keep, r)
		}
		if r.Offset == w.end {
			return keep, true
		}
	}
	return keep, false
}

func (w window) admits(r Record) bool {
	if r.Offset < w.from {
		return false
	}
	if r.Timestamp.IsZero() {
		return true
	}
	if !w.notBefore.IsZero() && r.Timestamp.Before(w.notBefore) {
		return false
	}
	return w.notAfter.IsZero() || !r.Timestamp.After(w.notAfter)
}
