package httpinbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

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
	// claimSQL inserts a started record that protects the key until
	// expires_at ($9 from now) and is remembered, as a tombstone, until
	// forget_at ($10 from now).
	claimSQL = `INSERT INTO {keys}
	(key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at, forget_at)
SELECT $1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 microsecond', now() + $9 * interval '1 microsecond',
	now() + $10 * interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (key_id) DO NOTHING`

	// claimLimitedSQL inserts only while the caller created fewer than $11
	// keys in the last minute.
	claimLimitedSQL = `INSERT INTO {keys}
	(key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at, forget_at)
SELECT $1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 microsecond', now() + $9 * interval '1 microsecond',
	now() + $10 * interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE (SELECT count(*) FROM {keys}
	WHERE tenant = $2 AND caller = $3 AND created_at > now() - interval '1 minute') < $11
ON CONFLICT (key_id) DO NOTHING`

	overLimitSQL = `SELECT count(*) >= $3 FROM {keys}
WHERE tenant = $1 AND caller = $2 AND created_at > now() - interval '1 minute'`

	// readSQL reads a record. An unknown record never counts as expired:
	// its request may have happened, so it waits for an operator. An
	// expired one is remembered until its forget_at (a record written
	// before forget_at existed is forgotten at its expiry).
	readSQL = `SELECT fingerprint, state, coalesce(locked_until > now(), false), expires_at <= now() AND state <> 'unknown',
	coalesce(forget_at, expires_at) > now(), expires_at,
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

	// cleanupSQL deletes up to $3 records whose tombstone has passed
	// (forget_at, or expires_at for a record written before forget_at
	// existed) by the cutoff $1, except a started one whose handler holds
	// its lease and an unknown one, which stays until an operator resolves
	// it. It walks the index of forget times from $2, which each chunk
	// advances to the newest time it deleted, so that no chunk reads again
	// the index entries of the rows deleted before it (they stay in the
	// index until VACUUM). It returns how many it deleted and that time.
	cleanupSQL = `WITH doomed AS (
	SELECT ctid FROM {keys}
	WHERE coalesce(forget_at, expires_at) >= $2 AND coalesce(forget_at, expires_at) <= $1 AND state <> 'unknown'
		AND NOT (state = 'started' AND coalesce(locked_until > now(), false))
	ORDER BY coalesce(forget_at, expires_at) LIMIT $3
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {keys} WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING coalesce(forget_at, expires_at) AS forget_at
)
SELECT count(*), coalesce(max(forget_at), $2) FROM gone`
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
	outcomeExpired                   // the key expired and is remembered: refuse it
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
	case outcomeExpired:
		return "expired"
	}
	return "unknown"
}

// record is the stored part of a key that a replay needs.
type record struct {
	fingerprint []byte
	state       KeyState
	leaseValid  bool
	expired     bool
	remembered  bool // its tombstone has not passed
	expiresAt   time.Time
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
func (m *Middleware) claim(ctx context.Context, c *Claim, fp idem.Hash) (outcome, record, error) {
	for range maxClaimRounds {
		switch inserted, err := m.insert(ctx, c, fp); {
		case err != nil:
			return 0, record{}, err
		case inserted:
			return outcomeRun, record{}, nil
		}
		rec, found, err := m.read(ctx, c.id)
		if err != nil {
			return 0, record{}, err
		}
		if !found {
			if m.cfg.NewKeysPerMinute > 0 {
				var over bool
				if err := m.pool.QueryRow(ctx, m.sql.overLimit, c.tenant, c.caller, m.cfg.NewKeysPerMinute).Scan(&over); err != nil {
					return 0, record{}, fmt.Errorf("httpinbox: count keys: %w", err)
				}
				if over {
					return outcomeLimited, record{}, nil
				}
			}
			continue // released or deleted between insert and read
		}
		if rec.expired {
			out, again, err := m.claimExpired(ctx, c, rec)
			if again {
				continue
			}
			return out, rec, err
		}
		if !bytes.Equal(rec.fingerprint, fp[:]) {
			return outcomeConflict, record{}, nil
		}
		if rec.state != KeyStarted {
			return outcomeReplay, rec, nil
		}
		if rec.leaseValid {
			return outcomeInProgress, record{}, nil
		}
		tag, err := m.pool.Exec(ctx, m.sql.takeover, c.id[:], c.owner, m.cfg.Lease.Microseconds())
		if err != nil {
			return 0, record{}, fmt.Errorf("httpinbox: take over key %s: %w", c.id.Short(), err)
		}
		if tag.RowsAffected() == 1 {
			m.log.Info("httpinbox: running a key again; its previous attempt did not commit",
				"operation", c.operation, "key_id", c.id.Short())
			return outcomeRun, record{}, nil
		}
		// Someone else took it over, or its handler still holds the row.
		return outcomeInProgress, record{}, nil
	}
	return 0, record{}, fmt.Errorf("httpinbox: key %s changed %d times while claiming it", c.id.Short(), maxClaimRounds)
}

// insert inserts c's record as started, for the request with fingerprint
// fp, and reports whether it did: false when the key has a record.
func (m *Middleware) insert(ctx context.Context, c *Claim, fp idem.Hash) (bool, error) {
	args := []any{c.id[:], c.tenant, c.caller, c.operation, c.key, fp[:], c.owner,
		m.cfg.Lease.Microseconds(), c.expiry.Microseconds(), (c.expiry + c.tombstone).Microseconds()}
	var (
		tag pgconn.CommandTag
		err error
	)
	if m.cfg.NewKeysPerMinute > 0 {
		tag, err = m.pool.Exec(ctx, m.sql.claimLimited, append(args, m.cfg.NewKeysPerMinute)...)
	} else {
		tag, err = m.pool.Exec(ctx, m.sql.claim, args...)
	}
	if err != nil {
		return false, fmt.Errorf("httpinbox: claim key %s: %w", c.id.Short(), err)
	}
	return tag.RowsAffected() == 1, nil
}

// claimExpired decides about c's record rec, which expired: refuse the key
// while its tombstone lasts, unless its request never committed (started);
// else delete the record, and the claim starts again (again).
func (m *Middleware) claimExpired(ctx context.Context, c *Claim, rec record) (out outcome, again bool, err error) {
	if rec.remembered && c.tombstone > 0 && rec.state != KeyStarted {
		// Its outcome may have taken effect, and the stored response no
		// longer answers for it.
		return outcomeExpired, false, nil
	}
	tag, err := m.pool.Exec(ctx, m.sql.deleteExpired, c.id[:])
	if err != nil {
		return 0, false, fmt.Errorf("httpinbox: delete expired key %s: %w", c.id.Short(), err)
	}
	if tag.RowsAffected() == 0 {
		// Another request is replacing it, or a handler that outlived the
		// expiry still holds it.
		return outcomeInProgress, false, nil
	}
	m.metrics.expired.Add(ctx, 1, m.metrics.opt(c.operation))
	return 0, true, nil
}

// read returns the record of key id.
func (m *Middleware) read(ctx context.Context, id idem.Hash) (record, bool, error) {
	var rec record
	err := m.pool.QueryRow(ctx, m.sql.read, id[:]).Scan(&rec.fingerprint, &rec.state, &rec.leaseValid,
		&rec.expired, &rec.remembered, &rec.expiresAt, &rec.status, &rec.header, &rec.body, &rec.bodyOmitted, &rec.resourceID)
	if errors.Is(err, pgx.ErrNoRows) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("httpinbox: read key %s: %w", id.Short(), err)
	}
	return rec, true, nil
}
