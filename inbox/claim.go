package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgplan"
)

// A claim that finds its message's row records the sighting on it (see
// sightingSQL): the last time and the highest stream offset at which any copy
// was claimed, so that retention keeps the row while copies keep coming and
// the horizon it records when it deletes the row covers every copy. A row
// this transaction inserted itself is left alone (the WHERE clause): its
// first claim is its only sighting, and Unclaim can still take it back.
// Such a row is not returned; its hash is read with storedHashSQL.
const sightingSQL = `ON CONFLICT (consumer, message_id) DO UPDATE
	SET seen_at = now(), seen_offset = GREATEST(t.seen_offset, t.stream_offset, EXCLUDED.stream_offset, EXCLUDED.seen_offset)
	WHERE t.xmin <> pg_current_xact_id()::xid`

// A batch's claims carry, per id, the highest offset of its later copies
// in the same batch (decided in Go, see decideRepeats) as seen_offset: a
// sighting in the transaction that inserts the row.
//
// claimSQL claims one message in one round trip: it inserts the row, or
// records the sighting on the row that is there and returns its hash
// (seen_at is NULL only on a row the statement inserted). A concurrent claim
// of the same id makes it wait until that transaction ends.
const claimSQL = `INSERT INTO %[1]s AS t (consumer, message_id, payload_hash, business_key, source, stream_offset, seen_offset)
VALUES ($1, $2, $3, NULLIF($4::text, ''), $5, $6, NULL::bigint)
` + sightingSQL + `
RETURNING t.seen_at IS NULL, t.payload_hash`

const storedHashSQL = `SELECT payload_hash FROM %[1]s WHERE consumer = $1 AND message_id = $2`

// claimBatchSQL is claimSQL for many claims in one statement.
const claimBatchSQL = `INSERT INTO %[1]s AS t (consumer, message_id, payload_hash, business_key, source, stream_offset, seen_offset)
SELECT c, m, h, NULLIF(k, ''), s, o, l
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) AS u(c, m, h, k, s, o, l)
` + sightingSQL + `
RETURNING t.consumer, t.message_id, t.seen_at IS NULL, t.payload_hash`

// claimNewBatchSQL inserts claims expected to be new, without ON CONFLICT:
// the primary key rejects one that is claimed already (23505). PostgreSQL
// does about a quarter less work per row than for INSERT … ON CONFLICT, which
// inserts speculatively and confirms each row.
//
// It inserts nothing unless the table named $8 is still a plain table: an
// inbox converted to the partitioned layout while this Inbox remembered the
// plain one (ConvertPartitioned) would take the rows into the partition of
// now without the check across partitions. The condition is read once per
// statement, from the catalog.
const claimNewBatchSQL = `INSERT INTO %[1]s (consumer, message_id, payload_hash, business_key, source, stream_offset, seen_offset)
SELECT c, m, h, NULLIF(k, ''), s, o, l
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) AS u(c, m, h, k, s, o, l)
WHERE (SELECT relkind FROM pg_class WHERE oid = to_regclass($8::text)) = 'r'`

// The lookups of a batch's keys join the rows to an array of whole keys,
// the consumer with each message id, and are planned at each execution
// (pgplan.PlannedNow). Written as consumer = $1 AND message_id = ANY($2),
// they let the planner read the consumer's whole range and filter the ids
// when its statistics say the consumer has few rows: they say so for every
// consumer that started after the table was last analyzed, until the
// consumer's rows reach a tenth of the table.
const storedHashesSQL = `SELECT t.consumer, t.message_id, t.payload_hash
FROM %[1]s AS t
JOIN unnest($1::text[], $2::text[]) AS u(c, m) ON t.consumer = u.c AND t.message_id = u.m`

// unclaimSQL deletes a row only if this transaction inserted it (at its top
// level): xmin is the transaction that wrote the row's version,
// pg_current_xact_id() is ours, and a row whose sighting this transaction
// recorded has a seen_at.
const unclaimSQL = `DELETE FROM %[1]s
WHERE consumer = $1 AND message_id = $2 AND xmin = pg_current_xact_id()::xid AND seen_at IS NULL`

// unclaimBatchSQL is unclaimSQL for many keys at once.
const unclaimBatchSQL = `DELETE FROM %[1]s AS t
USING unnest($1::text[], $2::text[]) AS u(c, m)
WHERE t.consumer = u.c AND t.message_id = u.m AND t.xmin = pg_current_xact_id()::xid AND t.seen_at IS NULL`

// statements holds the SQL of an Inbox with its table name filled in.
type statements struct {
	claim, storedHash, claimBatch, claimNewBatch, storedHashes, unclaim string
	unclaimBatch                                                        string
	lookup, cutoff, cleanup, horizon, horizons, deleteScope, touch      string
	consumers, consumerRows, table                                      string
	hold, release, held                                                 string
	partitionLock, partitionClaim, partitionDeleteScope                 string
	partitionPlan, partitionRestore                                     string
	heldAmong, forgetPartition                                          string
	forgetDiff, learnDiff, transferForget, transferLearn, removeClaims  string
}

func newStatements(table, horizons, holds string) statements {
	f := func(q string) string { return fmt.Sprintf(q, table, horizons, holds) }
	return statements{
		claim:          f(claimSQL),
		storedHash:     f(storedHashSQL),
		claimBatch:     f(claimBatchSQL),
		claimNewBatch:  f(claimNewBatchSQL),
		storedHashes:   f(storedHashesSQL),
		hold:           f(holdSQL),
		release:        f(releaseSQL),
		held:           f(heldSQL),
		horizons:       f(horizonsSQL),
		deleteScope:    f(deleteScopeSQL),
		forgetDiff:     f(forgetDiffSQL),
		learnDiff:      f(learnDiffSQL),
		transferForget: f(transferForgetSQL),
		transferLearn:  f(transferLearnSQL),
		removeClaims:   f(removeClaimsSQL),
		unclaim:        f(unclaimSQL),
		unclaimBatch:   f(unclaimBatchSQL),
		lookup:         f(lookupSQL),
		consumers:      f(consumersSQL),
		consumerRows:   f(consumerRowsSQL),
		table:          table,
		cutoff:         cutoffSQL,
		cleanup:        f(cleanupSQL),
		horizon:        f(horizonSQL),
		touch:          f(touchSQL),

		partitionLock:        partitionLockSQL,
		partitionPlan:        partitionPlanSQL,
		partitionRestore:     partitionRestoreSQL,
		partitionClaim:       f(partitionClaimSQL),
		partitionDeleteScope: f(partitionDeleteScopeSQL),
		heldAmong:            f(heldAmongSQL),
		forgetPartition:      f(forgetPartitionSQL),
	}
}

// Claim claims c.MessageID for c.Consumer inside tx and returns the decision.
// The row commits or rolls back with tx. A concurrent claim of the same id
// waits until the other transaction ends, then returns Duplicate or Conflict
// if it committed, NewMessage if it rolled back.
//
// Invalid input returns a *ValidationError before anything is sent.
func (ib *Inbox) Claim(ctx context.Context, tx pgx.Tx, c Claim) (Result, error) {
	if err := ib.validate(0, &c); err != nil {
		return Result{}, err
	}
	if p, err := ib.isPartitioned(ctx, tx); err != nil || p {
		if err != nil {
			return Result{}, err
		}
		res, err := ib.ClaimBatch(ctx, tx, []Claim{c})
		if err != nil {
			return Result{}, err
		}
		return res[0], nil
	}
	var inserted bool
	var stored []byte
	err := tx.QueryRow(ctx, ib.sql.claim, c.Consumer, c.MessageID, c.PayloadHash[:],
		c.BusinessKey, c.Source, c.StreamOffset).Scan(&inserted, &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		// This transaction claimed the id before: read what it stored.
		err = tx.QueryRow(ctx, ib.sql.storedHash, c.Consumer, c.MessageID).Scan(&stored)
	}
	if err != nil {
		return Result{}, fmt.Errorf("inbox: claim %q: %w", c.MessageID, ib.layoutChanged(err))
	}
	h, err := idem.HashFromBytes(stored)
	if err != nil {
		return Result{}, fmt.Errorf("inbox: claim %q: stored hash: %w", c.MessageID, err)
	}
	if inserted {
		return Result{Decision: NewMessage, StoredHash: h}, nil
	}
	return decide(c.PayloadHash, h), nil
}

type claimKey struct{ consumer, messageID string }

// ClaimBatch claims every message in claims inside tx, with the decisions
// Claim would return for them one after another: a first occurrence of an id
// decides against the table, a repeated id in the batch against the first
// occurrence (Duplicate for the same hash, Conflict otherwise). Results are
// in the order of claims. Like Claim, it records the sighting on the rows of
// duplicates and conflicts.
//
// It sends one INSERT … SELECT FROM unnest(…) … RETURNING for all claims
// and, only if the transaction claimed some of the ids before, one SELECT
// for their stored hashes. Every claim is validated before anything is
// sent; the first invalid one is returned as a *ValidationError with its
// Index.
//
// Rows are inserted in (consumer, message id) order, so two batches that
// overlap wait for each other instead of deadlocking.
func (ib *Inbox) ClaimBatch(ctx context.Context, tx pgx.Tx, claims []Claim) ([]Result, error) {
	first, pending, err := ib.prepareBatch(claims)
	if err != nil {
		return nil, err
	}
	results := make([]Result, len(claims))
	if len(pending) > 0 {
		got, err := ib.insertBatch(ctx, tx, claims, first, pending)
		if err != nil {
			return nil, err
		}
		var own []int // ids this transaction claimed before
		for _, i := range pending {
			r, ok := got[claimKey{claims[i].Consumer, claims[i].MessageID}]
			switch {
			case !ok:
				own = append(own, i)
			case r.inserted:
				results[i] = Result{Decision: NewMessage, StoredHash: r.hash}
			default:
				results[i] = decide(claims[i].PayloadHash, r.hash)
			}
		}
		if err := ib.decideOwn(ctx, tx, claims, own, results); err != nil {
			return nil, err
		}
	}
	decideRepeats(claims, first, results)
	return results, nil
}

// decideOwn decides claims[idx], ids this transaction claimed before,
// against the hashes it stored.
func (ib *Inbox) decideOwn(ctx context.Context, tx pgx.Tx, claims []Claim, idx []int, results []Result) error {
	if len(idx) == 0 {
		return nil
	}
	stored, err := ib.storedHashes(ctx, tx, claims, idx)
	if err != nil {
		return err
	}
	for _, i := range idx {
		h, ok := stored[claimKey{claims[i].Consumer, claims[i].MessageID}]
		if !ok {
			return fmt.Errorf("inbox: claim batch: the row of %q is gone from its own transaction", claims[i].MessageID)
		}
		results[i] = decide(claims[i].PayloadHash, h)
	}
	return nil
}

// ErrClaimed is returned (wrapped) by ClaimNewBatch when a message of the
// batch is claimed already. The transaction is aborted: roll it back and
// claim the batch with ClaimBatch in a new one.
var ErrClaimed = errors.New("inbox: a message of the batch is claimed already")

// ClaimNewBatch is ClaimBatch for batches whose messages are expected to be
// new: a stream read in order, a rebuild's private scope, a queue that
// redelivers little. It inserts them with a plain INSERT, which costs
// PostgreSQL about a quarter less per row than ClaimBatch's INSERT … ON
// CONFLICT, and reads nothing back. Every first occurrence of an id is
// NewMessage; a repeated id in the batch is decided against its first
// occurrence, as ClaimBatch does.
//
// If any message of the batch is claimed already, by an earlier transaction
// or by a concurrent one that commits (the INSERT waits for it), it returns
// an error wrapping ErrClaimed, and the transaction is aborted: roll back and
// claim the batch with ClaimBatch. Invalid claims return a *ValidationError
// before anything is sent, as with ClaimBatch.
func (ib *Inbox) ClaimNewBatch(ctx context.Context, tx pgx.Tx, claims []Claim) ([]Result, error) {
	first, pending, err := ib.prepareBatch(claims)
	if err != nil {
		return nil, err
	}
	if p, err := ib.isPartitioned(ctx, tx); err != nil {
		return nil, err
	} else if p && len(pending) > 0 {
		return ib.claimNewPartitioned(ctx, tx, claims, first, pending)
	}
	if len(pending) > 0 {
		args := append(portable(tx, batchArgs(claims, first, pending)), ib.table)
		tag, err := tx.Exec(ctx, ib.sql.claimNewBatch, args...)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				return nil, fmt.Errorf("inbox: claim new batch of %d: %w (%s)", len(pending), ErrClaimed, pgErr.Detail)
			}
			return nil, fmt.Errorf("inbox: claim new batch of %d: %w", len(pending), err)
		}
		if tag.RowsAffected() != int64(len(pending)) {
			// Converted to the partitioned layout meanwhile: nothing was
			// inserted, and the transaction goes on.
			if p, err := ib.readLayout(ctx, tx); err != nil || !p {
				return nil, fmt.Errorf("inbox: claim new batch of %d: inserted %d rows (%w)", len(pending), tag.RowsAffected(), err)
			}
			return ib.claimNewPartitioned(ctx, tx, claims, first, pending)
		}
	}
	results := make([]Result, len(claims))
	for _, i := range pending {
		results[i] = Result{Decision: NewMessage, StoredHash: claims[i].PayloadHash}
	}
	decideRepeats(claims, first, results)
	return results, nil
}

// prepareBatch validates claims and returns the index of each id's first
// occurrence and those indexes in (consumer, message id) order: two
// batches that overlap then insert in the same order and wait for each
// other instead of deadlocking.
func (ib *Inbox) prepareBatch(claims []Claim) (first map[claimKey]int, pending []int, err error) {
	for i := range claims {
		if err := ib.validate(i, &claims[i]); err != nil {
			return nil, nil, err
		}
	}
	first = make(map[claimKey]int, len(claims))
	for i, c := range claims {
		k := claimKey{c.Consumer, c.MessageID}
		if _, ok := first[k]; !ok {
			first[k] = i
			pending = append(pending, i)
		}
	}
	slices.SortFunc(pending, func(a, b int) int {
		return cmp.Or(cmp.Compare(claims[a].Consumer, claims[b].Consumer), cmp.Compare(claims[a].MessageID, claims[b].MessageID))
	})
	return first, pending, nil
}

// decideRepeats decides every repeated id of the batch against the result
// of its first occurrence.
func decideRepeats(claims []Claim, first map[claimKey]int, results []Result) {
	for i, c := range claims {
		if f := first[claimKey{c.Consumer, c.MessageID}]; f != i {
			results[i] = decide(c.PayloadHash, results[f].StoredHash)
		}
	}
}

// claimed is what the batch claim statement returned for one key.
type claimed struct {
	inserted bool
	hash     idem.Hash
}

// insertBatch claims claims[idx] and returns, per key, whether the
// statement inserted its row and the stored hash; a key it did not return
// was claimed by this transaction before.
func (ib *Inbox) insertBatch(ctx context.Context, tx pgx.Tx, claims []Claim, first map[claimKey]int, idx []int) (map[claimKey]claimed, error) {
	if p, err := ib.isPartitioned(ctx, tx); err != nil || p {
		if err != nil {
			return nil, err
		}
		return ib.claimPartitioned(ctx, tx, claims, first, idx)
	}
	rows, err := tx.Query(ctx, ib.sql.claimBatch, portable(tx, batchArgs(claims, first, idx))...)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch of %d: %w", len(idx), ib.layoutChanged(err))
	}
	got := make(map[claimKey]claimed, len(idx))
	var k claimKey
	var inserted bool
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.messageID, &inserted, &raw}, func() error {
		h, err := idem.HashFromBytes(raw)
		if err != nil {
			return fmt.Errorf("message %q: stored hash: %w", k.messageID, err)
		}
		got[k] = claimed{inserted: inserted, hash: h}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch of %d: %w", len(idx), ib.layoutChanged(err))
	}
	return got, nil
}

// batchArgs are the column arrays of claims[idx] for the batch inserts,
// the last one the highest offset of each id's later copies in the batch.
func batchArgs(claims []Claim, first map[claimKey]int, idx []int) []any {
	consumers := make(pointerArray[textElem], len(idx))
	ids := make(pointerArray[textElem], len(idx))
	hashes := make(pointerArray[byteaElem], len(idx))
	keys := make(pointerArray[textElem], len(idx))
	sources := make(pointerArray[textElem], len(idx))
	offsets := make([]*int64, len(idx))
	later := make([]*int64, len(idx))
	pos := make(map[int]int, len(idx)) // claims index → position in the arrays
	for j, i := range idx {
		c := &claims[i]
		consumers[j], ids[j], hashes[j] = textElem(c.Consumer), textElem(c.MessageID), c.PayloadHash[:]
		keys[j], sources[j], offsets[j] = textElem(c.BusinessKey), textElem(c.Source), c.StreamOffset
		pos[i] = j
	}
	for i, c := range claims {
		j, ok := pos[first[claimKey{c.Consumer, c.MessageID}]]
		if !ok || first[claimKey{c.Consumer, c.MessageID}] == i || c.StreamOffset == nil {
			continue
		}
		if later[j] == nil || *c.StreamOffset > *later[j] {
			later[j] = c.StreamOffset
		}
	}
	return []any{consumers, ids, hashes, keys, sources, offsets, later}
}

// storedHashes reads the stored hashes of claims[idx].
func (ib *Inbox) storedHashes(ctx context.Context, tx pgx.Tx, claims []Claim, idx []int) (map[claimKey]idem.Hash, error) {
	consumers, ids := make([]string, len(idx)), make([]string, len(idx))
	for j, i := range idx {
		consumers[j], ids[j] = claims[i].Consumer, claims[i].MessageID
	}
	rows, err := tx.Query(ctx, ib.sql.storedHashes, pgplan.PlannedNow(tx.Conn(), consumers, ids)...)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: read %d stored hashes: %w", len(idx), err)
	}
	stored := make(map[claimKey]idem.Hash, len(idx))
	var k claimKey
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&k.consumer, &k.messageID, &raw}, func() error {
		h, err := idem.HashFromBytes(raw)
		if err != nil {
			return fmt.Errorf("message %q: %w", k.messageID, err)
		}
		stored[k] = h
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: read %d stored hashes: %w", len(idx), err)
	}
	return stored, nil
}

// Unclaim deletes the row that this transaction claimed for messageID, so
// that a message whose handler failed is not recorded as processed when tx
// commits. The consumer runtime calls it after ROLLBACK TO SAVEPOINT when the
// claim was made before the savepoint (as ClaimBatch is).
//
// It deletes only a row inserted by tx itself at its top level, never one
// committed by an earlier transaction; otherwise it returns ErrNotClaimed. A
// claim made inside a savepoint needs no Unclaim: rolling back to that
// savepoint removes it.
func (ib *Inbox) Unclaim(ctx context.Context, tx pgx.Tx, consumer, messageID string) error {
	if err := ib.validateKey(0, consumer, messageID); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, ib.sql.unclaim, consumer, messageID)
	if err != nil {
		return fmt.Errorf("inbox: unclaim %q: %w", messageID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("inbox: unclaim %q for consumer %q: %w", messageID, consumer, ErrNotClaimed)
	}
	return nil
}

// Execer runs a statement: a *pgx.Conn, a pgx.Tx or a *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

const removeClaimsSQL = `DELETE FROM %[1]s WHERE consumer = $1 AND message_id = ANY($2::text[])`

// RemoveClaims deletes the rows of messageIDs, committed or not, outside
// the transaction that claimed them: the runtime's repair of claims that a
// handler committed before their time (a raw COMMIT past the guard), for
// messages whose handlers had not completed. It records no horizon: the
// messages were never applied. It returns how many rows it deleted.
func (ib *Inbox) RemoveClaims(ctx context.Context, q Execer, consumer string, messageIDs []string) (int64, error) {
	tag, err := q.Exec(ctx, ib.sql.removeClaims, consumer, messageIDs)
	if err != nil {
		return 0, fmt.Errorf("inbox: remove %d claims: %w", len(messageIDs), err)
	}
	return tag.RowsAffected(), nil
}

// UnclaimBatch is Unclaim for many ids in one statement: it deletes the rows
// tx itself inserted for them and returns how many it deleted. An id tx did
// not claim is left alone (and not counted), never an error.
func (ib *Inbox) UnclaimBatch(ctx context.Context, tx pgx.Tx, consumer string, messageIDs []string) (int64, error) {
	for i, id := range messageIDs {
		if err := ib.validateKey(i, consumer, id); err != nil {
			return 0, err
		}
	}
	consumers := make([]string, len(messageIDs))
	for i := range consumers {
		consumers[i] = consumer
	}
	tag, err := tx.Exec(ctx, ib.sql.unclaimBatch, pgplan.PlannedNow(tx.Conn(), consumers, messageIDs)...)
	if err != nil {
		return 0, fmt.Errorf("inbox: unclaim %d messages: %w", len(messageIDs), err)
	}
	return tag.RowsAffected(), nil
}

// validate checks c; i is its position in a batch.
func (ib *Inbox) validate(i int, c *Claim) error {
	bad := func(field string, err error, detail string) error {
		return &ValidationError{Index: i, Field: field, Err: err, Detail: detail}
	}
	if err := ib.validateKey(i, c.Consumer, c.MessageID); err != nil {
		return err
	}
	if c.PayloadHash.IsZero() {
		return bad("PayloadHash", ErrZeroHash, "")
	}
	for _, f := range []struct{ name, v string }{{"BusinessKey", c.BusinessKey}, {"Source", c.Source}} {
		if len(f.v) > ib.maxID {
			return bad(f.name, ErrInvalidField, fmt.Sprintf("%d bytes, limit %d", len(f.v), ib.maxID))
		}
		if !isText(f.v) {
			return bad(f.name, ErrInvalidField, fmt.Sprintf("%q is not valid UTF-8 text without NUL", f.v))
		}
	}
	return nil
}

// validateKey checks the primary key of a claim.
func (ib *Inbox) validateKey(i int, consumer, messageID string) error {
	bad := func(field string, err error, detail string) error {
		return &ValidationError{Index: i, Field: field, Err: err, Detail: detail}
	}
	switch {
	case consumer == "":
		return bad("Consumer", ErrEmptyConsumer, "")
	case len(consumer) > ib.maxID:
		return bad("Consumer", ErrInvalidConsumer, fmt.Sprintf("%d bytes, limit %d", len(consumer), ib.maxID))
	case !isText(consumer):
		return bad("Consumer", ErrInvalidConsumer, fmt.Sprintf("%q is not valid UTF-8 text without NUL", consumer))
	case messageID == "":
		return bad("MessageID", ErrEmptyMessageID, "")
	case len(messageID) > ib.maxID:
		return bad("MessageID", ErrMessageIDTooLong, fmt.Sprintf("%d bytes, limit %d", len(messageID), ib.maxID))
	case !isText(messageID):
		return bad("MessageID", ErrInvalidMessageID, fmt.Sprintf("%q is not valid UTF-8 text without NUL", messageID))
	}
	return nil
}

// isText reports whether PostgreSQL's text type can hold s.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// pointerArray is a one-dimensional array parameter that pgx encodes without
// an allocation per element. pgx reads array elements as interface values:
// a []string or [][]byte puts every element in an interface of its own, an
// allocation each. pointerArray hands out pointers to its elements instead
// (a pointer fits in an interface as is), and its element types give pgx
// their value through pgtype's valuer interfaces, not through reflection.
type pointerArray[T textElem | byteaElem] []T

// Dimensions implements pgtype.ArrayGetter; a nil array is SQL NULL.
func (a pointerArray[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a pointerArray[T]) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a pointerArray[T]) IndexType() any { return (*T)(nil) }

// textElem is a text element of a pointerArray.
type textElem string

// TextValue implements pgtype.TextValuer.
func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

// byteaElem is a bytea element of a pointerArray.
type byteaElem []byte

// BytesValue implements pgtype.BytesValuer.
func (e *byteaElem) BytesValue() ([]byte, error) { return *e, nil }

// portable returns args as pgx can send them on tx's connection. The exec
// and simple-protocol query modes (the usual ones behind PgBouncer) send
// parameters without their PostgreSQL type, and pgx then finds an encoding
// only for the types it knows: there, every pointerArray becomes the plain
// slice it stands for. The modes that describe a statement first get args
// as they are.
func portable(tx pgx.Tx, args []any) []any {
	switch tx.Conn().Config().DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
	default:
		return args
	}
	return plainArrays(args)
}

// plainArrays replaces every pointerArray of args with the plain slice it
// stands for, which pgx encodes in every format and mode.
func plainArrays(args []any) []any {
	for i, a := range args {
		switch a := a.(type) {
		case pointerArray[textElem]:
			var plain []string // nil stays NULL
			for _, e := range a {
				plain = append(plain, string(e))
			}
			if a != nil && plain == nil {
				plain = []string{}
			}
			args[i] = plain
		case pointerArray[byteaElem]:
			var plain [][]byte
			for _, e := range a {
				plain = append(plain, e)
			}
			if a != nil && plain == nil {
				plain = [][]byte{}
			}
			args[i] = plain
		}
	}
	return args
}

// layoutSQL asks whether the inbox table is partitioned.
const layoutSQL = `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`

// The layouts an Inbox has found its table in (Inbox.layout).
const (
	layoutUnknown int32 = iota
	layoutPlain
	layoutPartitioned
)

// isPartitioned reports whether the inbox table is partitioned. It asks
// the database once per Inbox and remembers the answer. An inbox converted
// online (ConvertPartitioned) while the Inbox remembers the plain layout is
// noticed by the claim that meets it (see layoutChanged).
func (ib *Inbox) isPartitioned(ctx context.Context, q Querier) (bool, error) {
	switch ib.layout.Load() {
	case layoutPlain:
		return false, nil
	case layoutPartitioned:
		return true, nil
	}
	return ib.readLayout(ctx, q)
}

// ErrLayoutChanged is returned (wrapped) by Claim and ClaimBatch when the
// inbox was converted to the partitioned layout (ConvertPartitioned) after
// this Inbox last read it: the transaction is aborted and nothing was
// claimed. Roll back and claim again in a new transaction, which takes the
// partitioned layout; the runtime does so by itself. ClaimNewBatch meets
// the conversion without an error.
var ErrLayoutChanged = errors.New("inbox: the inbox was converted to the partitioned layout meanwhile")

// layoutChanged returns err, wrapped with ErrLayoutChanged when it is the
// refusal of INSERT … ON CONFLICT on a table that has become partitioned
// (no unique index on the partitioned table matches the conflict target,
// 42P10); the layout is read again by the next claim.
func (ib *Inbox) layoutChanged(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P10" {
		ib.layout.Store(layoutUnknown)
		return fmt.Errorf("%w: %w", ErrLayoutChanged, err)
	}
	return err
}

// readLayout reads whether the inbox table is partitioned, whatever the
// Inbox remembers, and remembers the answer.
func (ib *Inbox) readLayout(ctx context.Context, q Querier) (bool, error) {
	var p bool
	if err := q.QueryRow(ctx, layoutSQL, ib.table).Scan(&p); err != nil {
		return false, fmt.Errorf("inbox: read the layout of %s: %w", ib.table, err)
	}
	if p {
		ib.layout.Store(layoutPartitioned)
	} else {
		ib.layout.Store(layoutPlain)
	}
	return p, nil
}
