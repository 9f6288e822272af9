package consumer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/canonjson"
)

// Handler processes one message inside the batch transaction tx. Its writes
// commit together with the message's inbox row, or not at all. Returning nil
// marks the message processed; Permanent or DeadLetter errors dead-letter it;
// any other error (or a panic, which becomes an *idem.PanicError) retries it
// later. The runtime owns tx: its Commit and Rollback fail with
// idem.ErrTransactionControl, and so do statements that would end it
// (COMMIT, ROLLBACK, SAVEPOINT…); a handler that tries anyway is
// dead-lettered with reason "handler_ended_transaction". ctx carries the
// HandlerTimeout deadline; past it the message's attempt fails with an
// *idem.TimeoutError.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// BatchHandler processes the new messages of one batch, in delivery order,
// inside the batch transaction tx. See Consumer.HandleBatch.
type BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// Message is one message as the handler sees it: idem.Message, the one
// model every part of idem shares.
type Message = idem.Message

// JSON adapts a handler that takes the decoded body. A body that does not
// decode into T (unknown fields are allowed) dead-letters the message with
// reason "decode_error".
func JSON[T any](fn func(ctx context.Context, tx pgx.Tx, m *Message, v T) error) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		var v T
		if err := json.Unmarshal(m.Body, &v); err != nil {
			return DeadLetter(deadletters.ReasonDecodeError, err)
		}
		return fn(ctx, tx, m, v)
	}
}

// IDFunc extracts a message's identity from the message as the source
// delivered it (m.ID is not set yet; m.MessageID is the message-id
// property). An empty id without error means the message has none: it is
// dead-lettered with reason "missing_message_id". An error wrapping
// idem.ErrInvalidID (an id with no one spelling) dead-letters it with
// reason "invalid_id", any other error with "invalid_message_id". Whatever
// the function returns must be valid UTF-8 without NUL, or the message is
// dead-lettered with "invalid_id": an id is refused, never repaired.
type IDFunc func(m *Message) (string, error)

// IDFromHeader uses the string header name. A missing or void header is no
// id; a header of another type, or one that is not valid UTF-8 text, is
// refused with idem.ErrInvalidID.
func IDFromHeader(name string) IDFunc {
	return func(m *Message) (string, error) {
		v, ok := m.Headers[name]
		if !ok || v == nil {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%w: header %q is %T, want string", idem.ErrInvalidID, name, v)
		}
		if err := canonjson.CheckID(s); err != nil {
			return "", fmt.Errorf("header %q: %w", name, err)
		}
		return s, nil
	}
}

// IDFromJSONField uses the top-level string or number field of a JSON
// body, read by the rules HashCanonicalJSON hashes by (those of
// idem.CanonicalJSON), so that two spellings of one value are one id:
//
//   - a number is its canonical spelling: 1000, 1000.0, 1e3, 1E3 and 10e2
//     are all the id "1000";
//   - a string is its decoded content, kept exactly: the string "1000" and
//     the number 1000 are the same id (their payloads hash differently, so
//     the second is a payload_conflict, never a second message), the
//     string "1e3" is the id "1e3";
//   - a missing field, null or "" is no id (missing_message_id).
//
// A value with no one spelling is refused, never repaired, with reason
// invalid_id: invalid UTF-8, an unpaired surrogate escape (\ud800), a NUL,
// a number canonical JSON refuses (an exponent of more than 9 digits, as
// written or once canonical),
// true, false, an array or an object. A body that is not a JSON object
// idem.CanonicalJSON accepts is refused with invalid_message_id (or
// decode_error first, under HashCanonicalJSON).
func IDFromJSONField(field string) IDFunc {
	return func(m *Message) (string, error) { return canonjson.FieldID(m.Body, field) }
}

// IDFromPayloadHash derives the id from the payload hash: two messages with
// the same body are then the same message. It is an explicit opt-in, never a
// fallback, because two legitimate equal messages (two deposits of 5) would
// collapse into one.
func IDFromPayloadHash(m *Message) (string, error) {
	return "sha256:" + m.Hash.String(), nil
}

// HashFunc computes the payload hash stored in the inbox.
type HashFunc func(body []byte) (idem.Hash, error)

// HashCanonicalJSON hashes the canonical form of a JSON body, so a payload
// that was re-serialised (keys reordered, whitespace, 1.0 vs 1) is not a
// conflict. A body that is not JSON is dead-lettered with "decode_error".
func HashCanonicalJSON(body []byte) (idem.Hash, error) { return idem.HashJSON(body) }
