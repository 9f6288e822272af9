package inbox

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// DefaultMaxIDBytes is the default limit on a message id, in bytes.
const DefaultMaxIDBytes = 512

// maxMaxIDBytes keeps (consumer, message_id) under PostgreSQL's B-tree entry
// limit (about 2,700 bytes): both are bounded by MaxIDBytes.
const maxMaxIDBytes = 1024

// Config configures an Inbox.
type Config struct {
	// MaxIDBytes is the longest message id, consumer, business key or source
	// accepted, in bytes. Default: DefaultMaxIDBytes (512); at most 1024, so
	// that the primary key stays within PostgreSQL's index entry limit.
	MaxIDBytes int
	// Tables says where the inbox table lives. Default: schema "public",
	// prefix "idem_".
	Tables idem.Tables
}

// Inbox claims messages for consumers. It is safe for concurrent use; it
// holds no connection, only the SQL for its table.
type Inbox struct {
	maxID  int
	sql    statements
	tables idem.Tables
	table  string       // the inbox table, quoted and qualified
	layout atomic.Int32 // layoutUnknown until isPartitioned asks
}

// New returns an Inbox for cfg, after validating it.
func New(cfg Config) (*Inbox, error) {
	if cfg.MaxIDBytes == 0 {
		cfg.MaxIDBytes = DefaultMaxIDBytes
	}
	if cfg.MaxIDBytes < 0 || cfg.MaxIDBytes > maxMaxIDBytes {
		return nil, fmt.Errorf("inbox: %w: MaxIDBytes %d: want 1 to %d", idem.ErrConfig, cfg.MaxIDBytes, maxMaxIDBytes)
	}
	if err := cfg.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	t := cfg.Tables.WithDefaults()
	return &Inbox{
		maxID:  cfg.MaxIDBytes,
		sql:    newStatements(t.Table("inbox"), t.Table("inbox_horizons"), t.Table("inbox_holds")),
		tables: t,
		table:  t.Table("inbox"),
	}, nil
}

// Decision is the outcome of a claim.
type Decision int

// The claim decisions. The zero value is not a decision, so a forgotten
// assignment is never mistaken for NewMessage.
const (
	// NewMessage means the message was not claimed before; this
	// transaction now holds its row and the handler should run. (It is not
	// called New because that is the constructor.)
	NewMessage Decision = iota + 1
	// Duplicate means the message was claimed before with the same payload
	// hash: it was processed already and must be acked without running the
	// handler.
	Duplicate
	// Conflict means the message id was claimed before with a different
	// payload hash (Result.StoredHash): the message must be dead-lettered,
	// never processed and never acked as a duplicate.
	Conflict
)

// String returns "new", "duplicate" or "conflict".
func (d Decision) String() string {
	switch d {
	case NewMessage:
		return "new"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Decision(%d)", int(d))
}

// Claim is one message to claim.
type Claim struct {
	// Consumer names the logical consumer; ids are unique per consumer.
	Consumer string
	// MessageID identifies the message within Consumer: valid UTF-8, no NUL,
	// at most Config.MaxIDBytes bytes.
	MessageID string
	// PayloadHash is the hash of the payload, usually idem.HashBytes(body)
	// or idem.HashJSON(body). It must not be the zero hash.
	PayloadHash idem.Hash
	// BusinessKey optionally names the business entity (an order number),
	// for operators. Empty is stored as NULL.
	BusinessKey string
	// Source is the queue or stream the message came from, for operators.
	Source string
	// StreamOffset is the message's stream offset, nil for queues.
	StreamOffset *int64
}

// Result is the outcome of one claim.
type Result struct {
	// Decision says whether to process, skip or dead-letter the message.
	Decision Decision
	// StoredHash is the payload hash the inbox holds for the id: the claim's
	// own hash for NewMessage and Duplicate, the other payload's hash for Conflict.
	StoredHash idem.Hash
}

// decide compares a claim's hash with the stored one.
func decide(claimed, stored idem.Hash) Result {
	if claimed == stored {
		return Result{Decision: Duplicate, StoredHash: stored}
	}
	return Result{Decision: Conflict, StoredHash: stored}
}

// ErrNotFound is returned by Lookup when the inbox holds no such row.
var ErrNotFound = errors.New("inbox: not found")

// ErrNotClaimed is returned by Unclaim when this transaction did not claim
// the message (at its top level), so there is nothing it may delete.
var ErrNotClaimed = errors.New("inbox: message not claimed by this transaction")
