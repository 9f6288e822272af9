package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// The partitioned layout (see LayOutPartitioned) keeps the inbox in time
// partitions on each row's last sighting, coalesce(seen_at, received_at),
// so that retention drops whole partitions. PostgreSQL cannot enforce
// uniqueness of (consumer, message_id) across partitions (a unique index
// on a partitioned table must contain the partition key), so the claim
// enforces it itself:
//
//  1. it takes a transaction-level advisory lock per key of the batch
//     (partitionLockSQL), in one order for every claimer, so that two
//     claims of one id never run their check at once, whichever partition
//     each would insert into;
//  2. in a second statement (partitionClaimSQL), whose snapshot is taken
//     after the locks are held, it looks every key up in every live
//     partition (an index probe per partition), records the sighting on
//     the rows it finds (which moves each of them into the partition of
//     now) and inserts the others into the partition of now.
//
// Each partition also has its own unique index on (consumer, message_id),
// which refuses a second copy in one partition even from a claimer that
// took no lock.
//
// What a claim costs. Per key: an advisory lock, and one index probe in
// each partition (the default partition, and the legacy one of a converted
// inbox, included): the cost per key grows linearly with the number of
// partitions, about retention / width + 6, of which the ones ahead of now,
// empty, cost little. A key found costs, besides, a read of its row's address in
// each of those partitions (the UPDATE's TID scans), and the move of its
// row into the partition of now. Per batch: one round trip, and no
// planning. The claim runs as a prepared statement on a generic plan
// (plan_cache_mode is set to force_generic_plan around it, see
// partitionPlanSQL) made once per connection, and again when a partition
// is made, attached, dropped or analyzed. That plan is made with sequential and bitmap
// scans, hash and merge joins, materialized inner sides and JIT disabled,
// so that it is index probes per key whatever the statistics said when it
// was made: a plan made while a partition was empty or small would
// otherwise read that partition whole, per batch or per key, once it has
// grown.
const (
	partitionLockSQL = `SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k`
	// partitionPlanSQL sets, for the rest of the transaction, the planner
	// settings the claim is planned with, and keeps the ones they replace
	// in idem.claim_restore for partitionRestoreSQL, which puts them back
	// once the claim has run (all three are sent at once, with the claim).
	partitionPlanSQL = `WITH saved AS (
	SELECT set_config('idem.claim_restore', concat_ws(',', current_setting('plan_cache_mode'), current_setting('enable_seqscan'),
		current_setting('enable_bitmapscan'), current_setting('enable_hashjoin'), current_setting('enable_mergejoin'),
		current_setting('enable_material'), current_setting('jit')), true)
)
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true), set_config('enable_material', 'off', true), set_config('jit', 'off', true)
FROM saved`
	partitionRestoreSQL = `SELECT set_config('plan_cache_mode', split_part(r, ',', 1), true), set_config('enable_seqscan', split_part(r, ',', 2), true),
	set_config('enable_bitmapscan', split_part(r, ',', 3), true), set_config('enable_hashjoin', split_part(r, ',', 4), true),
	set_config('enable_mergejoin', split_part(r, ',', 5), true), set_config('enable_material', split_part(r, ',', 6), true),
	set_config('jit', split_part(r, ',', 7), true)
FROM current_setting('idem.claim_restore') AS r`
	// partitionClaimSQL looks each key up once (found: the key, with the
	// row's partition, address and hash when there is one), records the
	// sighting on the rows found that an earlier transaction wrote, by
	// their addresses (a TID scan per partition: no plan of the UPDATE can
	// read a partition whole), and inserts the keys not found.
	partitionClaimSQL = `WITH u AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) AS u(c, m, h, k, s, o, l)
), found AS (
	SELECT u.c, u.m, u.h, u.k, u.s, u.o, u.l, t.tableoid AS part, t.ctid AS addr, t.payload_hash AS stored,
		t.xmin = pg_current_xact_id()::xid AS own
	FROM u LEFT JOIN %[1]s AS t ON t.consumer = u.c AND t.message_id = u.m
), seen AS (
	UPDATE %[1]s AS t SET seen_at = now(), seen_offset = GREATEST(t.seen_offset, t.stream_offset, f.o, f.l)
	FROM found AS f
	WHERE t.ctid = ANY (ARRAY(SELECT addr FROM found WHERE stored IS NOT NULL AND NOT own))
		AND t.tableoid = f.part AND t.ctid = f.addr AND NOT f.own
), added AS (
	INSERT INTO %[1]s (consumer, message_id, payload_hash, business_key, source, stream_offset, seen_offset)
	SELECT c, m, h, NULLIF(k, ''), s, o, l FROM found WHERE stored IS NULL
	RETURNING consumer, message_id, payload_hash
)
SELECT consumer, message_id, true, false, payload_hash FROM added
UNION ALL
SELECT c, m, false, own, stored FROM found WHERE stored IS NOT NULL`

	// partitionDeleteScopeSQL is deleteScopeSQL for a partitioned table,
	// where a row address (ctid) names a row only within its partition.
	partitionDeleteScopeSQL = `WITH gone AS (
	DELETE FROM %[1]s WHERE consumer = $1 AND message_id = ANY (ARRAY(
		SELECT message_id FROM %[1]s WHERE consumer = $1 AND message_id > $2 ORDER BY message_id LIMIT $3))
	RETURNING message_id
)
SELECT count(*), coalesce(max(message_id), $2) FROM gone`
)

// ErrPartitioned is returned (wrapped) by the operations the partitioned
// layout does not offer: a cleanup limited to one consumer (partitions hold
// every consumer's rows) and Transfer.
var ErrPartitioned = errors.New("inbox: not available on a partitioned inbox")

// lockKeys returns the advisory lock keys of claims[idx], sorted and
// without repeats, so that every claimer takes them in one order.
func (ib *Inbox) lockKeys(claims []Claim, idx []int) []int64 {
	keys := make([]int64, 0, len(idx))
	for _, i := range idx {
		keys = append(keys, ib.lockKey(claims[i].Consumer, claims[i].MessageID))
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// lockKey is the advisory lock key of one (consumer, message id) of this
// inbox table. Two keys that share a lock key only wait for each other.
func (ib *Inbox) lockKey(consumer, messageID string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem.inbox:" + ib.table + "\x00" + consumer + "\x00" + messageID))
	return int64(h.Sum64())
}

// claimPartitioned is insertBatch in the partitioned layout: it claims
// claims[idx] and returns, per key, whether it inserted the row and the
// stored hash; a key it does not return was claimed by this transaction
// before, as with insertBatch.
func (ib *Inbox) claimPartitioned(ctx context.Context, tx pgx.Tx, claims []Claim, first map[claimKey]int, idx []int) (map[claimKey]claimed, error) {
	// One round trip: the locks, the planner settings of the claim, the
	// claim, and the settings put back.
	var b pgx.Batch
	b.Queue(ib.sql.partitionLock, ib.lockKeys(claims, idx))
	b.Queue(ib.sql.partitionPlan)
	claim := b.Queue(ib.sql.partitionClaim, portable(tx, batchArgs(claims, first, idx))...)
	b.Queue(ib.sql.partitionRestore)
	got := make(map[claimKey]claimed, len(idx))
	claim.Query(func(rows pgx.Rows) error {
		var k claimKey
		var inserted, own bool
		var raw []byte
		_, err := pgx.ForEachRow(rows, []any{&k.consumer, &k.messageID, &inserted, &own, &raw}, func() error {
			h, err := idem.HashFromBytes(raw)
			if err != nil {
				return fmt.Errorf("message %q: stored hash: %w", k.messageID, err)
			}
			if !own {
				got[k] = claimed{inserted: inserted, hash: h}
			}
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return nil, fmt.Errorf("inbox: claim batch of %d: %w", len(idx), err)
	}
	return got, nil
}

// touchPartitioned is Touch in the partitioned layout: the sighting moves
// the row to the partition of now, so it runs in a transaction of its own
// (or a savepoint of q's) that holds the key's lock first, as a claim does.
func (ib *Inbox) touchPartitioned(ctx context.Context, q Execer, consumer, messageID string) (bool, error) {
	b, ok := q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return false, fmt.Errorf("inbox: touch %q of %q: a partitioned inbox needs a pool, a connection or a transaction", messageID, consumer)
	}
	var touched bool
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ib.sql.partitionLock, []int64{ib.lockKey(consumer, messageID)}); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, ib.sql.touch, consumer, messageID)
		touched = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("inbox: touch %q of %q: %w", messageID, consumer, err)
	}
	return touched, nil
}

// claimNewPartitioned is ClaimNewBatch in the partitioned layout: it claims
// claims[idx] as ClaimBatch does and returns ErrClaimed when any of them
// was claimed before. The caller rolls the transaction back, as it does
// after ErrClaimed in the plain layout, which takes the claims it made back.
func (ib *Inbox) claimNewPartitioned(ctx context.Context, tx pgx.Tx, claims []Claim, first map[claimKey]int, idx []int) ([]Result, error) {
	got, err := ib.claimPartitioned(ctx, tx, claims, first, idx)
	if err != nil {
		return nil, err
	}
	results := make([]Result, len(claims))
	for _, i := range idx {
		c := claims[i]
		if r, ok := got[claimKey{c.Consumer, c.MessageID}]; !ok || !r.inserted {
			return nil, fmt.Errorf("inbox: claim new batch of %d: %w (%q of %q)", len(idx), ErrClaimed, c.MessageID, c.Consumer)
		}
		results[i] = Result{Decision: NewMessage, StoredHash: c.PayloadHash}
	}
	decideRepeats(claims, first, results)
	return results, nil
}
