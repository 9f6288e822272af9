package httpinbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// The statements. {keys} is the quoted table; durations are passed in
// microseconds so that no interval parsing is involved.
//
// The claim commits with synchronous_commit off: it waits for no WAL flush.
// That is safe because the claim proves nothing by itself. The handler's
// transaction commits synchronously, and flushing its commit record flushes
// all WAL before it, the claim included; if the server crashes before that,
// the lost claim had no business effect and no response was sent (a
// concurrent request may have seen it as in progress and will retry).
const (
	claimSQL = `INSERT INTO {keys}
	(key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at)
SELECT $1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 microsecond', now() + $9 * interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (key_id) DO NOTHING`

	// claimLimitedSQL inserts only while the caller created fewer than $10
	// keys in the last minute.
	claimLimitedSQL = `INSERT INTO {keys}
	(key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at)
SELECT $1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 microsecond', now() + $9 * interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE (SELECT count(*) FROM {keys}
	WHERE tenant = $2 AND caller = $3 AND created_at > now() - interval '1 minute') < $10
ON CONFLICT (key_id) DO NOTHING`

	overLimitSQL = `SELECT count(*) >= $3 FROM {keys}
WHERE tenant = $1 AND caller = $2 AND created_at > now() - interval '1 minute'`

	// readSQL reads a record. An unknown record never counts as expired:
	// its request may have happened, so it waits for an operator.
	readSQL = `SELECT fingerprint, state, coalesce(locked_until > now(), false), expires_at <= now() AND state <> 'unknown',
	coalesce(status_code, 0), coalesce(headers, '{}'::jsonb), body, body_omitted, resource_id
FROM {keys} WHERE key_id = $1`

	// takeoverSQL takes a started record whose lease has expired. SKIP
	// LOCKED leaves alone a record whose handler transaction still holds the
	// row: that request is alive, only slow.
	takeoverSQL = `UPDATE {keys}
SET lock_owner = $2, locked_until = now() + $3 * interval '1 microsecond', attempts = attempts + 1
WHERE key_id = (SELECT key_id FROM {keys}
	WHERE key_id = $1 AND state = 'started' AND (locked_until IS NULL OR locked_until <= now())
	FOR UPDATE SKIP LOCKED)`

	deleteExpiredSQL = `DELETE FROM {keys}
WHERE key_id = (SELECT key_id FROM {keys} WHERE key_id = $1 AND expires_at <= now() AND state <> 'unknown'
	FOR UPDATE SKIP LOCKED)`

	relockSQL = `SELECT true FROM {keys} WHERE key_id = $1 AND lock_owner = $2 AND state = 'started' FOR UPDATE`

	completeSQL = `UPDATE {keys}
SET state = $3, status_code = $4, headers = $5, body = $6, body_omitted = $7, resource_id = $8,
	completed_at = now(), lock_owner = NULL, locked_until = NULL
WHERE key_id = $1 AND lock_owner = $2 AND state = 'started'`

	// releaseSQL ends this attempt's lease at once, so the next request with
	// the key runs again. It waits for the row lock of a handler transaction
	// still in flight, which makes it the proof of an ambiguous commit: it
	// matches only if that transaction did not commit.
	releaseSQL = `UPDATE {keys} SET lock_owner = NULL, locked_until = now()
WHERE key_id = $1 AND lock_owner = $2 AND state = 'started'`

	deleteSQL = `DELETE FROM {keys} WHERE key_id = $1 AND lock_owner = $2 AND state = 'started'`

	// cleanupSQL deletes expired records, except a started one whose
	// handler holds its lease and an unknown one, which stays until an
	// operator resolves it.
	cleanupSQL = `DELETE FROM {keys} WHERE key_id IN (
	SELECT key_id FROM {keys}
	WHERE expires_at <= now() AND state <> 'unknown' AND NOT (state = 'started' AND coalesce(locked_until > now(), false))
	ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`
)

type statements struct {
	claim, claimLimited, overLimit, read, takeover, deleteExpired string
	relock, complete, release, delete, cleanup                    string
}

func newStatements(t idem.Tables) statements {
	r := strings.NewReplacer("{keys}", t.Table("http_keys"))
	return statements{
		claim:         r.Replace(claimSQL),
		claimLimited:  r.Replace(claimLimitedSQL),
		overLimit:     r.Replace(overLimitSQL),
		read:          r.Replace(readSQL),
		takeover:      r.Replace(takeoverSQL),
		deleteExpired: r.Replace(deleteExpiredSQL),
		relock:        r.Replace(relockSQL),
		complete:      r.Replace(completeSQL),
		release:       r.Replace(releaseSQL),
		delete:        r.Replace(deleteSQL),
		cleanup:       r.Replace(cleanupSQL),
	}
}

// outcome is the claim decision for one request.
type outcome int

const (
	outcomeRun        outcome = iota // this request owns the key: run the handler
	outcomeReplay                    // a response is stored: send it
	outcomeConflict                  // the key belongs to a different request
	outcomeInProgress                // another request owns the key right now
	outcomeLimited                   // the caller may not create another key yet
)

// String names the outcome on spans.
func (o outcome) String() string {
	switch o {
	case outcomeRun:
		return "run"
	case outcomeReplay:
		return "replayed"
	case outcomeConflict:
		return "conflict"
	case outcomeInProgress:
		return "in_progress"
	case outcomeLimited:
		return "limited"
	}
	return "unknown"
}

// record is the stored part of a key that a replay needs.
type record struct {
	fingerprint []byte
	state       KeyState
	leaseValid  bool
	expired     bool
	stored
}

// stored is a response as kept in the record.
type stored struct {
	status      int
	header      http.Header
	body        []byte
	bodyOmitted bool
	resourceID  string
}

// maxClaimRounds bounds how often claim retries when the record changes
// under it (released, expired, deleted by a rejected request).
const maxClaimRounds = 8

// claim decides what to do with a request whose key is c and whose
// fingerprint is fp. It never checks before inserting: the insert is the
// check, and only a conflict leads to reading the record.
func (m *Middleware) claim(ctx context.Context, c *Claim, fp idem.Hash) (outcome, stored, error) {
	for range maxClaimRounds {
		var (
			tag pgconn.CommandTag
			err error
		)
		args := []any{c.id[:], c.tenant, c.caller, c.operation, c.key, fp[:], c.owner,
			m.cfg.Lease.Microseconds(), c.expiry.Microseconds()}
		if m.cfg.NewKeysPerMinute > 0 {
			tag, err = m.pool.Exec(ctx, m.sql.claimLimited, append(args, m.cfg.NewKeysPerMinute)...)
		} else {
			tag, err = m.pool.Exec(ctx, m.sql.claim, args...)
		}
		if err != nil {
			return 0, stored{}, fmt.Errorf("httpinbox: claim key %s: %w", c.id.Short(), err)
		}
		if tag.RowsAffected() == 1 {
			return outcomeRun, stored{}, nil
		}
		rec, found, err := m.read(ctx, c.id)
		if err != nil {
			return 0, stored{}, err
		}
		if !found {
			if m.cfg.NewKeysPerMinute > 0 {
				var over bool
				if err := m.pool.QueryRow(ctx, m.sql.overLimit, c.tenant, c.caller, m.cfg.NewKeysPerMinute).Scan(&over); err != nil {
					return 0, stored{}, fmt.Errorf("httpinbox: count keys: %w", err)
				}
				if over {
					return outcomeLimited, stored{}, nil
				}
			}
			continue // released or deleted between insert and read
		}
		if rec.expired {
			tag, err := m.pool.Exec(ctx, m.sql.deleteExpired, c.id[:])
			if err != nil {
				return 0, stored{}, fmt.Errorf("httpinbox: delete expired key %s: %w", c.id.Short(), err)
			}
			if tag.RowsAffected() == 0 {
				// Another request is replacing it, or a handler that outlived
				// the expiry still holds it.
				return outcomeInProgress, stored{}, nil
			}
			m.metrics.expired.Add(ctx, 1, m.metrics.opt(c.operation))
			continue
		}
		if !bytes.Equal(rec.fingerprint, fp[:]) {
			return outcomeConflict, stored{}, nil
		}
		if rec.state != KeyStarted {
			return outcomeReplay, rec.stored, nil
		}
		if rec.leaseValid {
			return outcomeInProgress, stored{}, nil
		}
		tag, err = m.pool.Exec(ctx, m.sql.takeover, c.id[:], c.owner, m.cfg.Lease.Microseconds())
		if err != nil {
			return 0, stored{}, fmt.Errorf("httpinbox: take over key %s: %w", c.id.Short(), err)
		}
		if tag.RowsAffected() == 1 {
			m.log.Info("httpinbox: running a key again; its previous attempt did not commit",
				"operation", c.operation, "key_id", c.id.Short())
			return outcomeRun, stored{}, nil
		}
		// Someone else took it over, or its handler still holds the row.
		return outcomeInProgress, stored{}, nil
	}
	return 0, stored{}, fmt.Errorf("httpinbox: key %s changed %d times while claiming it", c.id.Short(), maxClaimRounds)
}

// read returns the record of key id.
func (m *Middleware) read(ctx context.Context, id idem.Hash) (record, bool, error) {
	var rec record
	err := m.pool.QueryRow(ctx, m.sql.read, id[:]).Scan(&rec.fingerprint, &rec.state, &rec.leaseValid,
		&rec.expired, &rec.status, &rec.header, &rec.body, &rec.bodyOmitted, &rec.resourceID)
	if errors.Is(err, pgx.ErrNoRows) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("httpinbox: read key %s: %w", id.Short(), err)
	}
	return rec, true, nil
}
