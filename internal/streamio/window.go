package streamio

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// PositionKind says what a Position names.
type PositionKind uint8

// The kinds of Position.
const (
	// PositionDefault is the zero Position: First as a start, Tail as an
	// end.
	PositionDefault PositionKind = iota
	// PositionFirst is the oldest record the stream still holds.
	PositionFirst
	// PositionTail is the last record committed when a read starts.
	PositionTail
	// PositionOffset is a record by its offset.
	PositionOffset
	// PositionTime is a point in time.
	PositionTime
)

// Position is a point in a stream that a bounded read (or a replay) starts
// or ends at: First, Tail, an Offset or a Time. The zero Position means
// First as a start and Tail as an end. package replay names it
// replay.Position; ParsePosition there reads what String writes.
type Position struct {
	kind   PositionKind
	offset int64
	time   time.Time
}

// First is the oldest record the stream still holds.
func First() Position { return Position{kind: PositionFirst} }

// Tail is the last record committed when the read starts. Records appended
// while the read runs are not read.
func Tail() Position { return Position{kind: PositionTail} }

// Offset is the record at offset n (inclusive at both ends of a range).
func Offset(n int64) Position { return Position{kind: PositionOffset, offset: n} }

// Time is a point in time, compared with each record's creation time: as a
// start, the first record created at or after t; as an end, the last record
// created at or before t. The read itself starts from the first chunk the
// broker stored at or after t (chunk timestamps have millisecond precision
// and are taken by the broker when it writes the chunk).
func Time(t time.Time) Position { return Position{kind: PositionTime, time: t} }

// Kind says what p names.
func (p Position) Kind() PositionKind { return p.kind }

// At is the offset an Offset position names; 0 for the others.
func (p Position) At() int64 { return p.offset }

// When is the time a Time position names; zero for the others.
func (p Position) When() time.Time { return p.time }

// Or returns p, or def when p is the zero Position.
func (p Position) Or(def Position) Position {
	if p.kind == PositionDefault {
		return def
	}
	return p
}

// String returns "first", "tail", the offset ("1200") or the time in
// RFC 3339; "" for the zero Position.
func (p Position) String() string {
	switch p.kind {
	case PositionFirst:
		return "first"
	case PositionTail:
		return "tail"
	case PositionOffset:
		return strconv.FormatInt(p.offset, 10)
	case PositionTime:
		return p.time.UTC().Format(time.RFC3339Nano)
	default:
		return ""
	}
}

// ReadSpec is what a bounded Read reads.
type ReadSpec struct {
	// From is where the read starts: First, Offset or Time. Default:
	// First.
	From Position
	// MaxBatch caps the records handed to fn at once. Default:
	// DefaultMaxBatch.
	MaxBatch int
	// Stream is the stream's name. Required.
	Stream string
	// To is where the read ends, inclusive: Tail, Offset or
	// Time. An end past the tail is cut to the tail when the read
	// starts: a bounded read never waits for records to be appended.
	// Default: Tail.
	To Position
}

// Errors returned (wrapped) by Read for a spec that makes no sense.
var (
	// ErrInvalidSpec means a field of ReadSpec cannot be used: no stream, a
	// negative offset or batch size, Tail as a start, First as an
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
	if s.From.kind == PositionDefault {
		s.From = First()
	}
	if s.To.kind == PositionDefault {
		s.To = Tail()
	}
	switch {
	case s.From.kind == PositionTail:
		return s, fmt.Errorf("%w: From cannot be Tail", ErrInvalidSpec)
	case s.To.kind == PositionFirst:
		return s, fmt.Errorf("%w: To cannot be First", ErrInvalidSpec)
	case s.From.kind == PositionOffset && s.From.offset < 0, s.To.kind == PositionOffset && s.To.offset < 0:
		return s, fmt.Errorf("%w: offsets cannot be negative", ErrInvalidSpec)
	case s.From.kind == PositionTime && s.From.time.After(now):
		return s, fmt.Errorf("%w: From %s is after now", ErrStartInFuture, s.From)
	case s.From.kind == PositionOffset && s.To.kind == PositionOffset && s.To.offset < s.From.offset,
		s.From.kind == PositionTime && s.To.kind == PositionTime && s.To.time.Before(s.From.time):
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
