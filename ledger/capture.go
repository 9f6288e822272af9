package ledger

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Capture collects the effects Record would have written during a forensic
// replay, which must not write. It is safe for concurrent use.
type Capture struct {
	mu      sync.Mutex
	entries []Entry
	byID    map[string]int // index into entries
}

type captureKey struct{}

// WithCapture returns a context whose forensic-mode Records go to the
// returned Capture instead of the database.
func WithCapture(ctx context.Context) (context.Context, *Capture) {
	c := &Capture{byID: map[string]int{}}
	return context.WithValue(ctx, captureKey{}, c), c
}

func captureFrom(ctx context.Context) *Capture {
	c, _ := ctx.Value(captureKey{}).(*Capture)
	return c
}

// Effects returns the captured effects in the order they were recorded, one
// per effect id. Their Status is StatusPending, the status a live Record
// would have written.
func (c *Capture) Effects() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.entries)
}

// add keeps e unless its id was captured before; the same id with another
// request is a conflict, as it would be in the database.
func (c *Capture) add(e Entry) (Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.byID[e.ID]; ok {
		old := c.entries[i]
		if old.RequestHash != e.RequestHash {
			return Entry{}, &EffectConflictError{EffectID: e.ID, Stored: old.RequestHash, Recorded: e.RequestHash}
		}
		return old, nil
	}
	c.byID[e.ID] = len(c.entries)
	e.CreatedAt = time.Now()
	e.NextAttemptAt = e.CreatedAt
	c.entries = append(c.entries, e)
	return e, nil
}
