package replay

import (
	"errors"
	"testing"

	"github.com/idemkit/idem"
)

// FuzzParsePosition: --from and --to of a replay are first, tail, an offset
// or an RFC 3339 time; a run stores its range as String() and reads it
// again when it resumes, so every position ParsePosition accepts reads back
// as itself from its String(), and what it refuses is ErrInvalidPosition, a
// configuration error.
func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"first", " tail ", "0", "1200", "-1", "+5", "2025-01-31T12:00:00.0000005Z",
		"2025-01-31T13:00:00+01:00", "9999-12-31T23:30:00-01:00", "0000-01-01T00:30:00+01:00", "2025-01-31", "last"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePosition(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidPosition) || !errors.Is(err, idem.ErrConfig) {
				t.Fatalf("%q: %v is not ErrInvalidPosition and idem.ErrConfig", s, err)
			}
			return
		}
		again, err := ParsePosition(p.String())
		if err != nil || again.kind() != p.kind() || again.at() != p.at() || !again.when().Equal(p.when()) {
			t.Fatalf("%q: read as %q, which reads back as (%q, %v)", s, p, again, err)
		}
		if p.kind() == Offset(0).kind() && p.at() < 0 {
			t.Fatalf("%q: a negative offset %d", s, p.at())
		}
	})
}
