package deadletters

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpnames"
)

// Which rows are a dead-lettered message's own. Redrive matches a message
// of the dead-letter queue to its dead-letter row and its inbox row by
// (consumer, message id), the key both tables share, never by its payload:
// two messages with one body are two messages.
//
//   - idem's own copy (published by the consumer when it dead-lettered the
//     message) names its consumer (x-idem-consumer), the id its row records
//     (x-idem-message-id; a copy without it carries the consumer's default
//     id, its message-id property), its reason and its
//     payload hash. Its row is the oldest one not yet redriven with that
//     consumer, id, reason and hash: the one its dead-lettering wrote.
//   - A message the broker dead-lettered itself (x-death: a quorum queue's
//     delivery limit, a rejection, a length limit or a TTL on the queue)
//     names no consumer of idem's: any x-idem- header it carries was set
//     by its publisher, and steers nothing. It is judged for the consumer
//     the operator names (RedriveOptions.Consumer), by its message-id
//     property; a row counts as its own only when it also holds its
//     payload (hashed raw or as canonical JSON, the consumer's two hashes),
//     so that a consumer deriving ids from the body (consumer.IDFromJSONField)
//     never lends it another message's row.

// letter is what Redrive knows of a message it took from the dead-letter
// queue: whose it is, the id its rows record, why it is there and, once
// looked up, its dead-letter row.
type letter struct {
	// consumer is the consumer it is judged for; "" when nothing tells.
	consumer string
	// id is the message id its rows record; "" when it has none.
	id string
	// reason is why it entered the dead-letter queue: idem's x-idem-reason,
	// or the broker's reason (delivery_limit, rejected, maxlen, expired).
	reason string
	// hash is the payload hash idem's own copy names; nil on a message the
	// broker dead-lettered.
	hash []byte
	// died is when the broker dead-lettered it (its newest x-death time);
	// zero when it did not, or did not say when.
	died time.Time
	// row is its dead-letter row (0 when none was found), written at at.
	row int64
	at  time.Time
}

// own reports whether the letter is idem's own copy.
func (l *letter) own() bool { return l.hash != nil }

// entered is when the message entered the dead-letter queue: the broker's
// x-death time for a message it dead-lettered, else the time of its
// dead-letter row; zero when neither is known.
func (l *letter) entered() time.Time {
	if !l.own() && !l.died.IsZero() {
		return l.died
	}
	return l.at
}

// identify reads what d says of itself, as a message of the dead-letter
// queue of queue, for the operator's consumer (RedriveOptions.Consumer;
// "" for any).
func identify(d amqp.Delivery, queue, consumer string) letter {
	death, died := amqpnames.NewestDeath(d.Headers)
	if l, ok := ownCopy(d); ok && !(died && byBroker(death, queue)) {
		return l
	}
	return letter{consumer: consumer, id: d.MessageId, reason: death.Reason, died: death.Time}
}

// ownCopy returns the letter of d when d carries what idem's consumer puts
// on its copies: x-idem-consumer, x-idem-reason and a payload hash that is
// the hash of d's body (raw, or of its canonical JSON: the consumer's
// default and HashCanonicalJSON), so that a message published into the
// dead-letter queue with another message's headers takes no row of
// another's. identify takes it for idem's copy only when the broker did not
// dead-letter it since (see byBroker).
func ownCopy(d amqp.Delivery) (letter, bool) {
	consumer, _ := d.Headers[HeaderConsumer].(string)
	why, _ := d.Headers[HeaderReason].(string)
	hexHash, _ := d.Headers[HeaderPayloadHash].(string)
	hash, err := hex.DecodeString(hexHash)
	if consumer == "" || why == "" || err != nil || len(hash) != idem.HashSize || !hashesBody(hash, d.Body) {
		return letter{}, false
	}
	id, ok := d.Headers[HeaderMessageID].(string)
	if !ok {
		id = d.MessageId // a copy without the header: the consumer's default id
	}
	if id == "" {
		id = "sha256:" + hex.EncodeToString(hash) // no usable id: see Row.MessageID
	}
	return letter{consumer: consumer, id: id, reason: why, hash: hash}, true
}

// hashesBody reports whether hash is body's raw hash or the hash of its
// canonical JSON.
func hashesBody(hash, body []byte) bool {
	raw := idem.HashBytes(body)
	if bytes.Equal(hash, raw[:]) {
		return true
	}
	canonical, err := idem.HashJSON(body)
	return err == nil && bytes.Equal(hash, canonical[:])
}

// byBroker reports whether the newest x-death entry death says the broker
// put the message in this dead-letter queue: only the queue (or one of its
// partitions) dead-letters into it. idem's own copies carry other entries:
// the expiry of their retries in a retry queue, or a death upstream in
// another queue whose dead-lettering brought the message to this one.
func byBroker(death amqpnames.Death, queue string) bool {
	return death.Queue == queue || amqpnames.IsPartitionQueue(queue, death.Queue)
}

// payloadHashes are the hashes the dead-letter row of l, taken as d, may
// hold: the one idem's copy names, or for a message the broker
// dead-lettered, its body's raw and canonical JSON hashes.
func (l *letter) payloadHashes(d amqp.Delivery) [][]byte {
	if l.own() {
		return [][]byte{l.hash}
	}
	raw := idem.HashBytes(d.Body)
	out := [][]byte{raw[:]}
	if canonical, err := idem.HashJSON(d.Body); err == nil && canonical != raw {
		out = append(out, canonical[:])
	}
	return out
}

// matches reports whether l is selected by o's filters.
func (o RedriveOptions) matches(l letter) bool {
	return (o.Consumer == "" || l.consumer == o.Consumer) &&
		(o.MessageID == "" || l.id == o.MessageID) &&
		(o.Reason == "" || l.reason == o.Reason)
}

// rowSQL finds a message's own dead-letter row: the oldest row not yet
// redriven of consumer $1 and message id $2 holding one of the payload
// hashes $3 and, when $4 is given, reason $4, but none of the rows $5
// (those the chunk in hand already took: they are marked only when it
// settles). The index on (consumer, message_id) finds it.
func rowSQL(t idem.Tables) string {
	return `SELECT id, dead_lettered_at FROM ` + t.WithDefaults().Table("dead_letters") + `
WHERE consumer = $1 AND message_id = $2 AND payload_hash = ANY($3::bytea[])
	AND ($4::text IS NULL OR reason = $4::text) AND redriven_at IS NULL
	AND ($5::bigint[] IS NULL OR id <> ALL($5::bigint[]))
ORDER BY id LIMIT 1`
}

// findRow sets l's dead-letter row, if it has one besides the rows taken.
func (r *redrive) findRow(ctx context.Context, l *letter, d amqp.Delivery, taken []int64) error {
	if l.consumer == "" || l.id == "" {
		return nil
	}
	var why *string
	if l.own() {
		why = &l.reason
	}
	err := r.o.Pool.QueryRow(ctx, r.row, l.consumer, l.id, l.payloadHashes(d), why, taken).Scan(&l.row, &l.at)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("deadletters: redrive: read the dead-letter row of %q: %w", l.id, err)
	}
	return nil
}

// markSQL marks the rows $1 redriven by $2, those no one marked meanwhile.
func markSQL(t idem.Tables) string {
	return `UPDATE ` + t.WithDefaults().Table("dead_letters") + ` SET redriven_at = now(), redriven_by = NULLIF($2::text, '')
WHERE id = ANY($1::bigint[]) AND redriven_at IS NULL`
}

// rows are the dead-letter rows of the messages of chunk that move.
func rows(chunk []taken) []int64 {
	var out []int64
	for _, t := range chunk {
		if t.move && t.l.row != 0 {
			out = append(out, t.l.row)
		}
	}
	return out
}

// markRows marks the dead-letter rows of the messages of chunk that move,
// in one statement detached from cancellation, so that they are marked all
// or none.
func (r *redrive) markRows(ctx context.Context, chunk []taken) (int, error) {
	ids := rows(chunk)
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	tag, err := r.o.Pool.Exec(ctx, r.mark, ids, r.o.Operator)
	if err != nil {
		return 0, fmt.Errorf("deadletters: redrive: mark rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
