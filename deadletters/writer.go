package deadletters

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Row is one dead letter the runtime writes, in the transaction of the
// batch that decided it.
type Row struct {
	// MessageID is what an operator finds it by: its id, or "sha256:" and
	// its payload hash for a message without a usable one.
	MessageID string
	// PayloadHash is the hash of its payload.
	PayloadHash idem.Hash
	// StoredHash is the hash the inbox holds under its id, for a payload
	// conflict; zero otherwise.
	StoredHash idem.Hash
	// Reason and Error say why.
	Reason, Error string
	// Source, Exchange and RoutingKey say where it came from.
	Source, Exchange, RoutingKey string
	// Attempts is how many times it was tried.
	Attempts int
	// Payload is the payload itself, kept only when the consumer asks
	// (StorePayloads); nil otherwise.
	Payload []byte
}

// Writer writes the dead-letter rows that List reads and Redrive marks:
// the runtime's side of the table.
type Writer struct{ insert string }

// NewWriter returns a Writer for the dead-letter table of t.
func NewWriter(t idem.Tables) (*Writer, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("deadletters: %w", err)
	}
	return &Writer{insert: `INSERT INTO ` + t.WithDefaults().Table("dead_letters") + `
	(consumer, message_id, payload_hash, stored_hash, reason, error, source, exchange, routing_key, attempts, payload)
SELECT $1, t.message_id, t.payload_hash, t.stored_hash, t.reason, t.error, t.source, t.exchange, t.routing_key, t.attempts, t.payload
FROM unnest($2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::int[], $11::bytea[])
	AS t(message_id, payload_hash, stored_hash, reason, error, source, exchange, routing_key, attempts, payload)`}, nil
}

// Queue adds to b one statement that writes the rows of consumer; nothing
// when rows is empty.
func (w *Writer) Queue(b *pgx.Batch, consumer string, rows []Row) {
	if len(rows) == 0 {
		return
	}
	ids, reasons, errs := make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	sources, exchanges, keys := make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	hashes, stored, payloads := make([][]byte, len(rows)), make([][]byte, len(rows)), make([][]byte, len(rows))
	attempts := make([]int32, len(rows))
	for i, r := range rows {
		ids[i], reasons[i], errs[i] = r.MessageID, r.Reason, r.Error
		sources[i], exchanges[i], keys[i] = r.Source, r.Exchange, r.RoutingKey
		hashes[i], payloads[i], attempts[i] = r.PayloadHash[:], r.Payload, int32(r.Attempts)
		if !r.StoredHash.IsZero() {
			stored[i] = r.StoredHash[:]
		}
	}
	b.Queue(w.insert, consumer, ids, hashes, stored, reasons, errs, sources, exchanges, keys, attempts, payloads)
}
