package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/safetext"
)

// prepare turns a raw message into the handler's Message and the engine's
// item: it derives the payload hash, the identity and the business key, and
// marks messages that cannot be processed.
func (c *Consumer) prepare(raw *engine.Raw) *engine.Item {
	m := &Message{
		Body: raw.Body, Headers: raw.Headers, ContentType: raw.ContentType, CorrelationID: raw.CorrelationID,
		Exchange: raw.Exchange, RoutingKey: raw.RoutingKey, Redelivered: raw.Redelivered,
		DeliveryCount: raw.DeliveryCount, Attempt: max(raw.Attempt, 1), Source: raw.Source,
		Offset: raw.Offset, HasOffset: raw.HasOffset, Timestamp: raw.Timestamp, ReceivedAt: raw.ReceivedAt,
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	if m.Source == "" {
		m.Source = c.source
	}
	it := &engine.Item{Msg: m, Source: m.Source, Offset: m.Offset, HasOffset: m.HasOffset, Exchange: m.Exchange,
		RoutingKey: m.RoutingKey, Headers: m.Headers, ConversationID: m.CorrelationID, Body: m.Body, Attempt: m.Attempt}
	it.Reject = c.derive(m, raw.MessageID)
	it.ID, it.Hash, it.BusinessKey = m.ID, m.Hash, m.BusinessKey
	if it.Reject != nil && it.ID == "" && raw.MessageID != "" {
		// What the dead-letter row is found by: the id as far as it is text.
		it.ID = safetext.Truncate(safetext.Clean(raw.MessageID), 200)
	}
	return it
}

// prepareAll counts and prepares a batch (in parallel when it is large).
// A queue source counts its deliveries itself, a burst at a time.
func (c *Consumer) prepareAll(raws []engine.Raw) []*engine.Item {
	c.tel.Consumed(context.Background(), len(raws))
	return engine.PrepareAll(raws, c.prepare)
}

// derive fills m's hash, id and business key, or says why it cannot be
// processed.
func (c *Consumer) derive(m *Message, rawID string) *engine.Reject {
	reject := func(reason string, err error) *engine.Reject {
		if m.Hash.IsZero() { // rejected before Config.Hash could hash it
			m.Hash = idem.HashBytes(m.Body)
		}
		return &engine.Reject{Reason: reason, Err: err}
	}
	switch {
	case len(m.Body) > c.cfg.MaxMessageBytes:
		c.tel.Limit("message_bytes")
		return reject(deadletters.ReasonTooLarge, fmt.Errorf("body has %d bytes, limit is %d", len(m.Body), c.cfg.MaxMessageBytes))
	case len(m.Headers) > c.cfg.MaxHeaders:
		c.tel.Limit("headers")
		return reject(deadletters.ReasonTooManyHeaders, fmt.Errorf("message has %d headers, limit is %d", len(m.Headers), c.cfg.MaxHeaders))
	}
	h, err := c.cfg.Hash(m.Body)
	if err != nil {
		return reject(deadletters.ReasonDecodeError, fmt.Errorf("hash payload: %w", err))
	}
	m.Hash = h
	id, err := c.cfg.MessageID(m, rawID)
	switch {
	case err != nil:
		return reject(deadletters.ReasonInvalidMessageID, err)
	case id == "":
		return reject(deadletters.ReasonMissingMessageID, errMissingID)
	case len(id) > c.cfg.MaxIDBytes:
		c.tel.Limit("id_bytes")
		return reject(deadletters.ReasonInvalidMessageID, fmt.Errorf("message id has %d bytes, limit is %d", len(id), c.cfg.MaxIDBytes))
	case !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0:
		return reject(deadletters.ReasonInvalidMessageID, errors.New("message id is not valid UTF-8 text"))
	}
	m.ID = id
	if c.cfg.BusinessKey != nil {
		key, err := c.cfg.BusinessKey(m)
		if err == nil && (len(key) > c.cfg.MaxIDBytes || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0) {
			err = fmt.Errorf("business key is not valid UTF-8 text of at most %d bytes", c.cfg.MaxIDBytes)
		}
		if err != nil {
			return reject(deadletters.ReasonInvalidKey, err)
		}
		m.BusinessKey = key
	}
	return nil
}

// runHandler is the engine's handler: it hands the item's message, with
// what the engine learnt (its attempt, its original route), to the
// consumer's handler and turns a panic into a *PanicError.
func (c *Consumer) runHandler(ctx context.Context, tx pgx.Tx, it *engine.Item) (err error) {
	m := it.Msg.(*Message)
	learn(m, it)
	defer c.recoverPanic(&err, "handler panicked", m.ID)
	return c.handler(ctx, tx, m)
}

// runBatchHandler is the engine's batch handler.
func (c *Consumer) runBatchHandler(ctx context.Context, tx pgx.Tx, its []*engine.Item) (err error) {
	msgs := make([]*Message, len(its))
	for i, it := range its {
		msgs[i] = it.Msg.(*Message)
		learn(msgs[i], it)
	}
	defer c.recoverPanic(&err, "batch handler panicked", "")
	return c.batch(ctx, tx, msgs)
}

// learn gives m what the engine learnt from the attempts table: its attempt
// number and original route. It writes only what changed — before any
// handler saw m — so that a handler abandoned earlier, still reading m, does
// not race with the run that replaces it.
func learn(m *Message, it *engine.Item) {
	if m.Attempt != it.Attempt {
		m.Attempt = it.Attempt
	}
	if m.Exchange != it.Exchange {
		m.Exchange = it.Exchange
	}
	if m.RoutingKey != it.RoutingKey {
		m.RoutingKey = it.RoutingKey
	}
}

func (c *Consumer) recoverPanic(err *error, what, id string) {
	if v := recover(); v != nil {
		pe := &PanicError{Value: v, Stack: debug.Stack()}
		*err = pe
		c.cfg.Logger.Error(what, "consumer", c.cfg.Name, "message_id", safetext.ShortID(id),
			"panic", fmt.Sprint(v), "stack", string(pe.Stack))
	}
}
