package idem

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Flusher writes what it collected during a transaction, just before commit.
type Flusher interface {
	Flush(ctx context.Context, tx pgx.Tx) error
}

// Deferred collects writes that the owner of a transaction runs once, just
// before it commits, so that many small inserts become one statement. The
// consumer runtime puts one in every handler's context while it runs a batch
// without savepoints; the ledger uses it to record a whole batch's effects
// with one INSERT. A Flusher that fails makes the runtime run the batch again
// with savepoints and without a Deferred, so that each write happens at once
// and each error reaches the handler that caused it.
type Deferred struct {
	mu   sync.Mutex
	uses int
	keys []any
	m    map[any]Flusher
}

// Use returns the Flusher registered under key, creating it with create the
// first time. Keys are compared like map keys (a *Ledger, say).
func (d *Deferred) Use(key any, create func() Flusher) Flusher {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.uses++
	if f, ok := d.m[key]; ok {
		return f
	}
	if d.m == nil {
		d.m = map[any]Flusher{}
	}
	f := create()
	d.m[key] = f
	d.keys = append(d.keys, key)
	return f
}

// Uses counts the calls to Use so far: one per deferred write. The runtime
// compares it before and after a handler to know whether the handler
// deferred anything.
func (d *Deferred) Uses() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.uses
}

// Flush runs every Flusher in the order they were first used.
func (d *Deferred) Flush(ctx context.Context, tx pgx.Tx) error {
	d.mu.Lock()
	keys := d.keys
	d.mu.Unlock()
	for _, k := range keys {
		if err := d.m[k].Flush(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}

type deferredKey struct{}

// WithDeferred returns a context that carries d.
func WithDeferred(ctx context.Context, d *Deferred) context.Context {
	return context.WithValue(ctx, deferredKey{}, d)
}

// DeferredFrom returns the Deferred carried by ctx, or nil: then writes must
// happen at once.
func DeferredFrom(ctx context.Context) *Deferred {
	d, _ := ctx.Value(deferredKey{}).(*Deferred)
	return d
}
