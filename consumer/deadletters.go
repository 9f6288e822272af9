package consumer

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// maxStoredError bounds the error text kept per dead letter.
const maxStoredError = 4096

// insertDeadLettersSQL writes every dead letter of a batch in one statement.
const insertDeadLettersSQL = `INSERT INTO %s
	(consumer, message_id, payload_hash, stored_hash, reason, error, source, exchange, routing_key, attempts, payload)
SELECT $1, t.message_id, t.payload_hash, t.stored_hash, t.reason, t.error, t.source, t.exchange, t.routing_key, t.attempts, t.payload
FROM unnest($2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::int[], $11::bytea[])
	AS t(message_id, payload_hash, stored_hash, reason, error, source, exchange, routing_key, attempts, payload)`

// insertDeadLetters records the batch's dead letters inside tx, so that the
// row exists exactly when the batch commits.
func (c *Consumer) insertDeadLetters(ctx context.Context, tx pgx.Tx, scope string, msgs []*Message, results []result) error {
	var (
		ids, reasons, errs, sources, exchanges, keys []string
		hashes, stored, payloads                     [][]byte
		attempts                                     []int32
	)
	for i, r := range results {
		if r.outcome != outcomeDeadLettered {
			continue
		}
		m := msgs[i]
		ids = append(ids, cleanText(m.ID))
		hashes = append(hashes, m.Hash[:])
		if r.storedHash.IsZero() {
			stored = append(stored, nil)
		} else {
			h := r.storedHash
			stored = append(stored, h[:])
		}
		reasons = append(reasons, r.reason)
		errs = append(errs, errorText(r.err))
		sources = append(sources, cleanText(m.Source))
		exchanges = append(exchanges, cleanText(m.Exchange))
		keys = append(keys, cleanText(m.RoutingKey))
		attempts = append(attempts, int32(max(m.Attempt, 1)))
		if c.cfg.StorePayloads {
			payloads = append(payloads, m.Body)
		} else {
			payloads = append(payloads, nil)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	sql := fmt.Sprintf(insertDeadLettersSQL, c.cfg.Tables.Table("dead_letters"))
	if _, err := tx.Exec(ctx, sql, scope, ids, hashes, stored, reasons, errs, sources, exchanges, keys, attempts, payloads); err != nil {
		return fmt.Errorf("consumer: record %d dead letters: %w", len(ids), err)
	}
	return nil
}

// errorText is err's text, bounded, with invalid UTF-8 replaced.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > maxStoredError {
		s = s[:maxStoredError]
	}
	return cleanText(s)
}

// cleanText makes s storable as PostgreSQL text: valid UTF-8 (a cut in the
// middle of a character becomes U+FFFD), no NUL bytes. Dead letters hold
// whatever the producer sent; one bad byte must not fail the batch.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}
