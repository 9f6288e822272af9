package httpinbox

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keyset"
)

// KeyState is the state of a key's record.
type KeyState string

// The states of a record. A request claims its key as KeyStarted; the
// handler's transaction ends it as KeyCompleted, KeyFailedReplayable or
// KeyUnknown, together with the stored response.
const (
	// KeyStarted: a request owns the key under a lease, or crashed before
	// its commit (then the next request takes it over once the lease ends).
	KeyStarted KeyState = "started"
	// KeyCompleted: the response (status below 400) is stored and replayed.
	KeyCompleted KeyState = "completed"
	// KeyFailedReplayable: an application failure (a 4xx) is stored and
	// replayed.
	KeyFailedReplayable KeyState = "failed_replayable"
	// KeyUnknown: the handler could not prove its outcome (Unknown); the
	// response is replayed and the key never runs again until an operator
	// resolves it.
	KeyUnknown KeyState = "unknown"
)

// keyStates is every state, in the order of a record's life.
var keyStates = [...]KeyState{KeyStarted, KeyCompleted, KeyFailedReplayable, KeyUnknown}

// KeyStates returns every state, in the order of a record's life, in a new
// slice the caller may change.
func KeyStates() []KeyState { return slices.Clone(keyStates[:]) }

// Valid reports whether s is one of KeyStates.
func (s KeyState) Valid() bool { return slices.Contains(keyStates[:], s) }

// Errors of the operator functions (Keys).
var (
	// ErrKeyNotFound: no record has this key id.
	ErrKeyNotFound = errors.New("httpinbox: no such idempotency key")
	// ErrKeyInFlight: a handler's transaction holds the record; wait for it.
	ErrKeyInFlight = errors.New("httpinbox: a request with this key is running")
	// ErrKeyNotResolvable: the record's state cannot move where the
	// resolution asks (a stored response is never thrown away).
	ErrKeyNotResolvable = errors.New("httpinbox: this key cannot be resolved so")
	// ErrKeyResolved: an operator resolved the key already, at the same
	// moment as this resolution or before it; it comes as a
	// *ResolvedError saying who, when and how, and matches
	// ErrKeyNotResolvable too when the record cannot move so any more.
	ErrKeyResolved = errors.New("httpinbox: an operator resolved the key already")
)

// KeyRecord is one record of the http_keys table, as an operator sees it.
type KeyRecord struct {
	// KeyID is KeyID(Tenant, Caller, Operation, Key), the record's id.
	KeyID string
	// Tenant, Caller and Operation are the key's scope: for a webhook, the
	// caller is the provider and the operation "webhook:" + provider.
	Tenant    string
	Caller    string
	Operation string
	// Key is the idempotency key as the client sent it (for a webhook, the
	// event id; for a bulk item, the item key).
	Key string
	// State is where the record stands.
	State KeyState
	// Fingerprint is the request's (see the package doc).
	Fingerprint idem.Hash
	// Attempts counts the requests that ran the handler for this key.
	Attempts int
	// LockOwner and LockedUntil are the lease of a started record.
	LockOwner   string
	LockedUntil time.Time
	// Status, Header and Body are the stored response; Body is nil when
	// BodyOmitted.
	Status      int
	Header      http.Header
	Body        []byte
	BodyOmitted bool
	// ResourceID is the stored Response.ResourceID.
	ResourceID string
	// CreatedAt is the first request's time, CompletedAt the commit of the
	// stored response (zero while started), ExpiresAt when the record stops
	// protecting the key, ForgetAt when its tombstone ends (a request with
	// the key is refused from ExpiresAt to ForgetAt) and cleanup may delete
	// it; ForgetAt is ExpiresAt without a tombstone.
	CreatedAt   time.Time
	CompletedAt time.Time
	ExpiresAt   time.Time
	ForgetAt    time.Time
}

// KeyFilter selects records for Keys.List and Keys.ResolveWhere. Empty
// fields select all.
type KeyFilter struct {
	// State keeps records in this state; ResolveWhere requires it.
	State     KeyState
	Tenant    string
	Caller    string
	Operation string
	// Key is the idempotency key as the client sent it.
	Key string
	// After continues a listing after the record whose Cursor it is:
	// pages are in the order records were created (created_at, then key
	// id), and a record created or changed meanwhile neither repeats nor
	// shifts the pages. Empty starts with the oldest.
	After string
	// Limit is the most records returned (ResolveWhere: resolved per
	// page). Default: 100.
	Limit int
}

// Cursor returns the position of r in a listing, for KeyFilter.After: the
// next page starts after r.
func (r KeyRecord) Cursor() string { return keyset.Encode(r.CreatedAt, r.KeyID) }

// KeyResolution is an operator's decision about a key.
type KeyResolution struct {
	// As is where the record goes. KeyCompleted confirms an unknown
	// outcome: it happened, the stored response stays and is replayed.
	// KeyStarted hands the key back: the client's next request with the
	// same request body runs the handler again. That is for an unknown
	// outcome known not to have happened, or a started key whose lease is
	// longer than the operator wants to wait.
	As KeyState
	// Reason says why, for the audit trail. Required.
	Reason string
	// Operator says who decided. Required.
	Operator string
	// From, when set, is the state the operator saw the record in: a
	// record that has moved on since (its request finished, another
	// operator resolved it) is refused with ErrKeyNotResolvable rather
	// than resolved on what the operator no longer sees. ResolveWhere sets
	// it to its filter's state.
	From KeyState
}

// KeyAudit is one operator decision about a key.
type KeyAudit struct {
	Operator string
	From     KeyState
	To       KeyState
	Reason   string
	At       time.Time
}

// KeyStats is a summary of the records.
type KeyStats struct {
	// Counts holds the number of records in each state present.
	Counts map[KeyState]int64
	// OldestInProgress is the age (from its first request) of the oldest
	// started record under a live lease: a request running, or one that
	// crashed and whose lease has not ended yet. A record whose attempt
	// failed, or whose lease ended, waits for its client's next request and
	// is not counted. Zero when there is none.
	OldestInProgress time.Duration
	// OldestUnknown is how long the oldest unknown outcome has waited for
	// an operator; zero when there is none.
	OldestUnknown time.Duration
}

const keyColumns = `key_id, tenant, caller, operation, idempotency_key, state, fingerprint, attempts,
	coalesce(lock_owner::text, ''), locked_until, coalesce(status_code, 0), coalesce(headers, '{}'::jsonb),
	body, body_omitted, resource_id, created_at, completed_at, expires_at, coalesce(forget_at, expires_at)`

const (
	// listKeysSQL reads a page in (created_at, key_id) order: after the
	// cursor $7, $8 when $7 is set, created at or before $9 when set.
	// listKeysSQL reads a page of records in (created_at, key_id) order,
	// under the conditions of the filter's set fields (keyset.Where),
	// through the index that matches them (migration 0021).
	listKeysSQL = `SELECT ` + keyColumns + ` FROM {keys}`

	getKeySQL = `SELECT ` + keyColumns + ` FROM {keys} WHERE key_id = $1`

	// lockKeySQL fails at once (NOWAIT) when a handler's transaction holds
	// the record.
	lockKeySQL = `SELECT state FROM {keys} WHERE key_id = $1 FOR UPDATE NOWAIT`

	// resolveKeySQL moves a record for an operator. Handing it back
	// (started) clears the stored response and ends the lease, so the next
	// request with the same fingerprint takes the key over.
	resolveKeySQL = `UPDATE {keys} SET state = $3,
	lock_owner = NULL,
	locked_until = CASE WHEN $3 = 'started' THEN now() END,
	status_code = CASE WHEN $3 = 'started' THEN NULL ELSE status_code END,
	headers = CASE WHEN $3 = 'started' THEN NULL ELSE headers END,
	body = CASE WHEN $3 = 'started' THEN NULL ELSE body END,
	body_omitted = CASE WHEN $3 = 'started' THEN false ELSE body_omitted END,
	completed_at = CASE WHEN $3 = 'started' THEN NULL ELSE completed_at END
WHERE key_id = $1 AND state = $2
RETURNING ` + keyColumns

	keyAuditSQL = `INSERT INTO {audit} (key_id, operator, from_state, to_state, reason) VALUES ($1, $2, $3, $4, $5)`

	keyHistorySQL = `SELECT operator, from_state, to_state, reason, at FROM {audit} WHERE key_id = $1 ORDER BY at, id`

	keyCountsSQL = `SELECT state, count(*) FROM {keys} GROUP BY state`

	// keyAgesSQL reads the two ages through the partial indexes on started
	// and unknown records. In progress is a started record under a live
	// lease: one whose attempt failed or crashed waits for its client's next
	// request, which runs it again by itself.
	keyAgesSQL = `SELECT
	coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM {keys}
		WHERE state = 'started' AND locked_until > now())), 0)::float8,
	coalesce(extract(epoch FROM now() - (SELECT min(completed_at) FROM {keys} WHERE state = 'unknown')), 0)::float8`
)

// keySQL holds the operator statements for one set of tables, and the
// table's name, which names its operators' advisory locks.
type keySQL struct {
	list, get, lock, resolve, audit, history, counts, ages, table string
	turn                                                          turnStatements
}

func newKeySQL(t idem.Tables) keySQL {
	r := strings.NewReplacer("{keys}", t.Table("http_keys"), "{audit}", t.Table("http_keys_audit"))
	return keySQL{
		list: r.Replace(listKeysSQL), get: r.Replace(getKeySQL), lock: r.Replace(lockKeySQL),
		resolve: r.Replace(resolveKeySQL), audit: r.Replace(keyAuditSQL), history: r.Replace(keyHistorySQL),
		counts: r.Replace(keyCountsSQL), ages: r.Replace(keyAgesSQL), table: t.Table("http_keys"),
		turn: newTurnStatements(t.Table("http_keys_audit"), "key_id"),
	}
}

// Keys is the operator's view of the records: list, show and resolve them,
// and measure what waits (the `idem http-keys` command is built on it). It
// needs no Middleware and no scope. It is safe for concurrent use.
type Keys struct {
	pool *pgxpool.Pool
	sql  keySQL
}

// NewKeys returns the operator functions for the http_keys table of tables
// in pool.
func NewKeys(pool *pgxpool.Pool, tables idem.Tables) (*Keys, error) {
	if err := tables.Validate(); err != nil {
		return nil, fmt.Errorf("httpinbox: %w", err)
	}
	return &Keys{pool: pool, sql: newKeySQL(tables)}, nil
}

// List returns a page of the records that match f, oldest first: at most
// f.Limit, after f.After. When it returns f.Limit records, the next page
// starts after the last one's Cursor.
func (k *Keys) List(ctx context.Context, f KeyFilter) ([]KeyRecord, error) {
	return k.list(ctx, f, time.Time{})
}

// list is List of the records created at or before end, when end is set.
func (k *Keys) list(ctx context.Context, f KeyFilter, end time.Time) ([]KeyRecord, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("httpinbox: list keys: unknown state %q", f.State)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var w keyset.Where
	w.Equal("state", string(f.State))
	w.Equal("tenant", f.Tenant)
	w.Equal("caller", f.Caller)
	w.Equal("operation", f.Operation)
	w.Equal("idempotency_key", f.Key)
	err := w.After(f.After, "created_at", "key_id", "bytea", func(id string) (any, error) { return hex.DecodeString(id) })
	if err != nil {
		return nil, fmt.Errorf("httpinbox: list keys: after %q: %w", f.After, keyset.ErrCursor)
	}
	if !end.IsZero() {
		w.Add("created_at <= " + w.Arg(end) + "::timestamptz")
	}
	sql := k.sql.list + w.SQL() + " ORDER BY created_at, key_id LIMIT " + w.Arg(f.Limit)
	rows, err := k.pool.Query(ctx, sql, w.Args...)
	if err != nil {
		return nil, fmt.Errorf("httpinbox: list keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyRecord, error) { return scanKey(row) })
	if err != nil {
		return nil, fmt.Errorf("httpinbox: list keys: %w", err)
	}
	return out, nil
}

// Get returns the record with id keyID (64 hex digits, as KeyID returns),
// or an error matching ErrKeyNotFound.
func (k *Keys) Get(ctx context.Context, keyID string) (KeyRecord, error) {
	id, err := parseKeyID(keyID)
	if err != nil {
		return KeyRecord{}, err
	}
	rec, err := scanKey(k.pool.QueryRow(ctx, k.sql.get, id))
	if err != nil {
		return KeyRecord{}, fmt.Errorf("httpinbox: get key %s: %w", keyID, keyNotFound(err))
	}
	return rec, nil
}

// History returns the operator decisions about keyID, oldest first.
func (k *Keys) History(ctx context.Context, keyID string) ([]KeyAudit, error) {
	id, err := parseKeyID(keyID)
	if err != nil {
		return nil, err
	}
	rows, err := k.pool.Query(ctx, k.sql.history, id)
	if err != nil {
		return nil, fmt.Errorf("httpinbox: key history %s: %w", keyID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyAudit, error) {
		var a KeyAudit
		err := row.Scan(&a.Operator, &a.From, &a.To, &a.Reason, &a.At)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("httpinbox: key history %s: %w", keyID, err)
	}
	return out, nil
}

// Stats counts records by state and measures what waits.
func (k *Keys) Stats(ctx context.Context) (KeyStats, error) {
	s := KeyStats{Counts: map[KeyState]int64{}}
	rows, err := k.pool.Query(ctx, k.sql.counts)
	if err != nil {
		return KeyStats{}, fmt.Errorf("httpinbox: key stats: %w", err)
	}
	var (
		state KeyState
		n     int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		s.Counts[state] = n
		return nil
	}); err != nil {
		return KeyStats{}, fmt.Errorf("httpinbox: key stats: %w", err)
	}
	s.OldestInProgress, s.OldestUnknown, err = keyAges(ctx, k.pool, k.sql.ages)
	return s, err
}

// keyAges runs keyAgesSQL.
func keyAges(ctx context.Context, pool *pgxpool.Pool, sql string) (inProgress, unknown time.Duration, err error) {
	var a, b float64
	if err := pool.QueryRow(ctx, sql).Scan(&a, &b); err != nil {
		return 0, 0, fmt.Errorf("httpinbox: key ages: %w", err)
	}
	return seconds(a), seconds(b), nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// scanKey reads keyColumns.
func scanKey(row pgx.Row) (KeyRecord, error) {
	var (
		r           KeyRecord
		id, fp      []byte
		lockedUntil *time.Time
		completedAt *time.Time
	)
	err := row.Scan(&id, &r.Tenant, &r.Caller, &r.Operation, &r.Key, &r.State, &fp, &r.Attempts,
		&r.LockOwner, &lockedUntil, &r.Status, &r.Header, &r.Body, &r.BodyOmitted, &r.ResourceID,
		&r.CreatedAt, &completedAt, &r.ExpiresAt, &r.ForgetAt)
	if err != nil {
		return KeyRecord{}, err
	}
	r.KeyID = hex.EncodeToString(id)
	if r.Fingerprint, err = idem.HashFromBytes(fp); err != nil {
		return KeyRecord{}, err
	}
	if lockedUntil != nil {
		r.LockedUntil = *lockedUntil
	}
	if completedAt != nil {
		r.CompletedAt = *completedAt
	}
	return r, nil
}

// parseKeyID decodes a key id as KeyID writes it.
func parseKeyID(keyID string) ([]byte, error) {
	id, err := hex.DecodeString(keyID)
	if err != nil || len(id) != idem.HashSize {
		return nil, fmt.Errorf("%w: %q is not a key id (64 hex digits)", ErrKeyNotFound, keyID)
	}
	return id, nil
}

// keyNotFound turns "no rows" into ErrKeyNotFound.
func keyNotFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrKeyNotFound
	}
	return err
}
