package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// entryColumns is the column list every query that returns an Entry selects,
// in scanEntry's order.
const entryColumns = `effect_id, effect_type, consumer, message_id, business_key, target,
	idempotency_key, request_hash, request, status, attempt_count, next_attempt_at,
	locked_until, lock_owner, last_error, response_hash, response, created_at, completed_at,
	trace_context, maybe_sent`

// statements holds the ledger's SQL with the table names filled in once.
type statements struct {
	channel string // the NOTIFY channel, unquoted
	listen  string

	record, recordMany, storedHashes, get, list          string
	statusCount, table                                   string
	guard, guardMany, tombstone                          string
	gauges                                               string
	claim, claimUnknown, complete, sweep, resolve, audit string
	history                                              string
}

func newStatements(t idem.Tables) (*statements, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	t = t.WithDefaults()
	r := strings.NewReplacer(
		"{ledger}", t.Table("ledger"),
		"{audit}", t.Table("ledger_audit"),
		"{tombstones}", t.Table("ledger_tombstones"),
		"{columns}", entryColumns,
	)
	ch := channelName(t)
	return &statements{
		channel:      ch,
		listen:       "LISTEN " + pgx.Identifier{ch}.Sanitize(),
		record:       r.Replace(recordSQL),
		recordMany:   r.Replace(recordManySQL),
		storedHashes: r.Replace(storedHashesSQL),
		guard:        r.Replace(guardSQL),
		guardMany:    r.Replace(guardManySQL),
		tombstone:    r.Replace(tombstoneSQL),
		get:          r.Replace(getSQL),
		list:         r.Replace(listSQL),
		statusCount:  r.Replace(statusCountSQL),
		table:        t.Table("ledger"),
		gauges:       r.Replace(gaugesSQL),
		claim:        r.Replace(claimSQL),
		claimUnknown: r.Replace(claimUnknownSQL),
		complete:     r.Replace(completeSQL),
		sweep:        r.Replace(sweepSQL),
		resolve:      r.Replace(resolveSQL),
		audit:        r.Replace(auditSQL),
		history:      r.Replace(historySQL),
	}, nil
}

// channelName is the NOTIFY channel of the ledger in t: fixed length, so any
// schema and prefix fit PostgreSQL's identifier limit.
func channelName(t idem.Tables) string {
	sum := sha256.Sum256([]byte(t.Schema + "\x00" + t.Prefix))
	return "idem_ledger_" + hex.EncodeToString(sum[:8])
}

const getSQL = `SELECT {columns} FROM {ledger} WHERE effect_id = $1`

// scanEntry reads one row of entryColumns.
func scanEntry(row pgx.Row) (Entry, error) {
	var (
		e                        Entry
		reqHash, respHash        []byte
		status                   string
		lockedUntil, completedAt *time.Time
		lockOwner                *string
	)
	err := row.Scan(&e.ID, &e.Type, &e.Consumer, &e.MessageID, &e.BusinessKey, &e.Target,
		&e.IdempotencyKey, &reqHash, &e.Request, &status, &e.AttemptCount, &e.NextAttemptAt,
		&lockedUntil, &lockOwner, &e.LastError, &respHash, &e.Response, &e.CreatedAt, &completedAt,
		&e.TraceContext, &e.MaybeSent)
	if err != nil {
		return Entry{}, err
	}
	e.Status = Status(status)
	if e.RequestHash, err = idem.HashFromBytes(reqHash); err != nil {
		return Entry{}, err
	}
	if respHash != nil {
		if e.ResponseHash, err = idem.HashFromBytes(respHash); err != nil {
			return Entry{}, err
		}
	}
	if lockedUntil != nil {
		e.LockedUntil = *lockedUntil
	}
	if completedAt != nil {
		e.CompletedAt = *completedAt
	}
	if lockOwner != nil {
		e.LockOwner = *lockOwner
	}
	return e, nil
}

// notFound turns pgx.ErrNoRows into ErrNotFound for id.
func notFound(id string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("ledger: effect %s: %w", id, ErrNotFound)
	}
	return err
}
