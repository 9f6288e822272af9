package replay

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/configerr"
	"github.com/idemkit/idem/internal/streamio"
)

// Position is where a replay starts or ends: First, Tail, an Offset or a
// Time. The zero Position means First as Options.From and Tail as
// Options.To. ParsePosition reads the command-line forms, which String
// writes.
type Position struct{ p streamio.Position }

// First is the oldest record the stream still holds.
func First() Position { return Position{streamio.First()} }

// Tail is the last record committed when the replay starts: records
// appended while it runs are not replayed.
func Tail() Position { return Position{streamio.Tail()} }

// Offset is the record at stream offset n, inclusive at both ends.
func Offset(n int64) Position { return Position{streamio.Offset(n)} }

// Time is a point in time, compared with each record's creation time: as a
// start, the first record created at or after t; as an end, the last record
// created at or before t.
func Time(t time.Time) Position { return Position{streamio.Time(t)} }

// String returns "first", "tail", the offset ("1200") or the time in
// RFC 3339: what ParsePosition reads. The zero Position is "".
func (p Position) String() string { return p.p.String() }

// stream is p as the stream reader takes it; kind, at and when are its
// parts (see streamio.Position).
func (p Position) stream() streamio.Position   { return p.p }
func (p Position) kind() streamio.PositionKind { return p.p.Kind() }
func (p Position) at() int64                   { return p.p.At() }
func (p Position) when() time.Time             { return p.p.When() }

// or returns p, or def when p is the zero Position.
func (p Position) or(def Position) Position { return Position{p.p.Or(def.p)} }

// ErrInvalidPosition is returned (wrapped) by ParsePosition. It matches
// idem.ErrConfig.
var ErrInvalidPosition = configerr.New("replay: invalid position")

// ParsePosition reads "first", "tail", a non-negative offset ("1200") or an
// RFC 3339 time ("2025-01-31T12:00:00Z").
func ParsePosition(s string) (Position, error) {
	switch s = strings.TrimSpace(s); s {
	case "first":
		return First(), nil
	case "tail":
		return Tail(), nil
	case "":
		return Position{}, fmt.Errorf("%w: empty (want first, tail, an offset or an RFC 3339 time)", ErrInvalidPosition)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return Position{}, fmt.Errorf("%w: offset %d is negative", ErrInvalidPosition, n)
		}
		return Offset(n), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		// A run stores its range in UTC and reads it again when it resumes:
		// a time whose UTC year has no four-digit spelling would not read back.
		if y := t.UTC().Year(); y < 0 || y > 9999 {
			return Position{}, fmt.Errorf("%w: %q is outside the years 0000 to 9999 in UTC", ErrInvalidPosition, s)
		}
		return Time(t), nil
	}
	return Position{}, fmt.Errorf("%w: %q (want first, tail, an offset or an RFC 3339 time)", ErrInvalidPosition, s)
}
