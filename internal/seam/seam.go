// Package seam lets the module's own packages — the stream source and
// replay — run a *consumer.Consumer's handlers through its engine, without
// package consumer exporting its internals.
package seam

import "github.com/idemkit/idem/internal/engine"

// Consumer is what a *consumer.Consumer holds for the module's packages.
type Consumer struct {
	// Engine runs the consumer's handlers.
	Engine *engine.Engine
	// Prepare derives the identity of raw messages (id, hash, business key)
	// and wraps each in an item whose Msg is a *consumer.Message.
	Prepare func(raws []engine.Raw) []*engine.Item
	// Lag is the stream position the consumer reports.
	Lag *engine.Lag
}

// Of returns what c, a *consumer.Consumer, holds; ok is false for anything
// else. Package consumer sets it when it is initialised.
var Of func(c any) (Consumer, bool)
