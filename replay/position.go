package replay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

// Position is where a replay starts or ends: First, Tail, an Offset or a
// Time. The zero Position means First as Options.From and Tail as
// Options.To. ParsePosition reads the command-line forms, which String
// writes.
type Position = streamio.Position

// First is the oldest record the stream still holds.
func First() Position { return streamio.First() }

// Tail is the last record committed when the replay starts: records
// appended while it runs are not replayed.
func Tail() Position { return streamio.Tail() }

// Offset is the record at stream offset n, inclusive at both ends.
func Offset(n int64) Position { return streamio.Offset(n) }

// Time is a point in time, compared with each record's creation time: as a
// start, the first record created at or after t; as an end, the last record
// created at or before t.
func Time(t time.Time) Position { return streamio.Time(t) }

// ErrInvalidPosition is returned (wrapped) by ParsePosition.
var ErrInvalidPosition = errors.New("replay: invalid position")

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
		return Time(t), nil
	}
	return Position{}, fmt.Errorf("%w: %q (want first, tail, an offset or an RFC 3339 time)", ErrInvalidPosition, s)
}
