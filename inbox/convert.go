package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrHoldsRows is returned (wrapped) by LayOutPartitioned for a plain inbox
// that holds rows: convert it with ConvertPartitioned, which keeps them.
var ErrHoldsRows = errors.New("inbox: the inbox holds rows; convert it online (ConvertPartitioned) to keep them")

// Online conversion (ConvertPartitioned). The plain table becomes the
// first partition of the partitioned inbox, the legacy partition, for
// every time before a bound a few minutes ahead (legacy_until); the time
// partitions start at the bound. Claims find the ids of the legacy
// partition as they find those of any partition (an index probe each), and
// its rows keep their unique index. Retention deletes its expired rows in
// chunks, as in the plain layout, and drops it whole once the bound is
// before the cutoff.
//
// The steps, each its own transaction, none holding a lock that blocks a
// claim for longer than convertLockTimeout (a step not granted its lock in
// time is tried again):
//
//  1. add a check that every row's last sighting is before the bound, NOT
//     VALID: a moment's exclusive lock, no scan; rows written from then on
//     are checked as they are written;
//  2. validate it: a scan of the table, under a lock that lets claims run;
//  3. rename the table, make the partitioned table under its name and
//     attach the old one as the partition of the times before the bound:
//     the validated check proves the partition's range, so ATTACH reads no
//     row under its exclusive lock;
//  4. make the time partitions from the bound on (EnsurePartitions).
//
// Until step 3 commits, claims insert into the plain table, whose
// sightings stay before the bound while now() is; step 3 gives up and the
// conversion starts again with a bound further ahead when less than half
// the lead is left.
const (
	// convertLockTimeout bounds how long each step waits for its lock,
	// and so how long a claim queued behind it waits.
	convertLockTimeout = "500ms"
	// convertAttempts is how many times a step whose lock was not granted
	// in time is tried, convertPause apart.
	convertAttempts = 40
	convertPause    = 250 * time.Millisecond
	// convertLead is how far ahead of now the legacy partition ends, at
	// least; it doubles on each new start.
	convertLead = 10 * time.Minute
	// convertRounds is how many times the conversion starts again with a
	// bound further ahead.
	convertRounds = 3
)

const (
	legacyUntilSQL = `SELECT coalesce((SELECT extract(epoch FROM legacy_until)::bigint FROM %s WHERE legacy_until IS NOT NULL), 0)`
	// hashCheckSQL names the check of the payload hash of the plain table.
	hashCheckSQL = `SELECT conname FROM pg_constraint
WHERE conrelid = to_regclass($1) AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%octet_length(payload_hash)%'`
	// boundSQL is the first bucket boundary at least $2 seconds after now,
	// and now.
	boundSQL = `SELECT (ceil((extract(epoch FROM now()) + $2) / $1) * $1)::bigint, extract(epoch FROM now())::bigint`
)

// holdsRows reports whether the inbox is a plain table that holds rows.
// It takes no lock.
func (ib *Inbox) holdsRows(ctx context.Context, q Querier) (bool, error) {
	if p, err := ib.readLayout(ctx, q); err != nil || p {
		return false, err
	}
	var rows bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+ib.table+")").Scan(&rows); err != nil {
		return false, fmt.Errorf("inbox: read whether %s holds rows: %w", ib.table, err)
	}
	return rows, nil
}

// legacyUntil returns where the legacy partition ends (Unix seconds), or 0
// when the inbox has none.
func (ib *Inbox) legacyUntil(ctx context.Context, q Querier) (int64, error) {
	var until int64
	if err := q.QueryRow(ctx, fmt.Sprintf(legacyUntilSQL, ib.tables.Table("inbox_layout"))).Scan(&until); err != nil {
		return 0, fmt.Errorf("inbox: read the bound of the legacy partition: %w", err)
	}
	return until, nil
}

// legacy names the partition of an inbox converted online.
func (ib *Inbox) legacy() (name, table string) {
	name = ib.tables.Prefix + "inbox_legacy"
	return name, pgx.Identifier{ib.tables.Schema, name}.Sanitize()
}

// ConvertPartitioned lays out in time partitions of width an inbox that
// may hold rows and be claimed from while it runs: its table becomes one
// partition, for the times before a bound a few minutes ahead, and the time
// partitions start at the bound. It is what `idem migrate
// --partition-width` does on an inbox that holds rows. No row is copied;
// the table is read once (to validate a check, under a lock that lets
// claims run), and no step holds a lock that blocks a claim for more than
// half a second. An inbox that holds no row is laid out as
// LayOutPartitioned does; one partitioned already with width is left
// alone.
//
// Workers may run through the conversion. Their claims go on deciding
// against every row: the first claim of each Inbox after the switch reads
// the new layout (a ClaimNewBatch goes on in its transaction; a Claim or
// ClaimBatch returns ErrLayoutChanged, which the runtime retries at once).
// Retention (Cleanup) deletes the expired rows of the old table in chunks,
// and drops it whole once its bound is older than the cutoff.
func (ib *Inbox) ConvertPartitioned(ctx context.Context, pool *pgxpool.Pool, width time.Duration) error {
	if width < MinPartitionWidth || width > MaxPartitionWidth || width%time.Second != 0 {
		return fmt.Errorf("inbox: partition width %v: want whole seconds from %v to %v", width, MinPartitionWidth, MaxPartitionWidth)
	}
	return ib.convert(ctx, pool, width, convertLead)
}

// convert is ConvertPartitioned for a width already checked, with the
// first lead. It makes the partitions after it gave its connection back,
// so that a pool of one connection serves both.
func (ib *Inbox) convert(ctx context.Context, pool *pgxpool.Pool, width, lead time.Duration) error {
	if err := ib.convertAlone(ctx, pool, width, lead); err != nil {
		return err
	}
	if _, err := ib.EnsurePartitions(ctx, pool, 0); err != nil {
		return fmt.Errorf("inbox: convert %s: %w", ib.table, err)
	}
	return nil
}

// convertAlone lays the inbox out, or converts it (steps 1 to 3), on one
// connection holding the conversion's advisory lock.
func (ib *Inbox) convertAlone(ctx context.Context, pool *pgxpool.Pool, width, lead time.Duration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("inbox: convert %s: %w", ib.table, err)
	}
	defer conn.Release()
	// One conversion at a time per table.
	key := convertKey(ib.table)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("inbox: convert %s: %w", ib.table, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	}()
	rows, err := ib.holdsRows(ctx, conn)
	if err != nil {
		return err
	}
	if !rows {
		err = shortTx(ctx, conn.Conn(), func(tx pgx.Tx) error { return ib.layOut(ctx, tx, width) })
		if !errors.Is(err, ErrHoldsRows) { // done, or failed; rows came meanwhile: convert
			return err
		}
	}
	var check string
	if err := conn.QueryRow(ctx, hashCheckSQL, ib.table).Scan(&check); err != nil {
		return fmt.Errorf("inbox: convert %s: the check of the payload hash: %w", ib.table, err)
	}
	w := int64(width / time.Second)
	for range convertRounds {
		err = ib.convertOnce(ctx, conn.Conn(), w, check, lead)
		if !errors.Is(err, errLateSwitch) {
			break
		}
		lead *= 2
	}
	if err != nil {
		return fmt.Errorf("inbox: convert %s: %w", ib.table, err)
	}
	ib.layout.Store(layoutPartitioned)
	return nil
}

// errLateSwitch ends a round of the conversion whose bound came too close
// before the switch.
var errLateSwitch = errors.New("inbox: the bound of the legacy partition came too close; starting again")

// convertOnce is one round of the conversion (steps 1 to 3), with a bound
// at least lead ahead.
func (ib *Inbox) convertOnce(ctx context.Context, conn *pgx.Conn, w int64, check string, lead time.Duration) error {
	var until, now int64
	if err := conn.QueryRow(ctx, boundSQL, w, int64(lead/time.Second)).Scan(&until, &now); err != nil {
		return err
	}
	bound := time.Unix(until, 0).UTC()
	rangeCheck := pgx.Identifier{ib.tables.Prefix + "inbox_legacy_range"}.Sanitize()
	literal := "'" + bound.Format(time.RFC3339) + "'::timestamptz"
	drop := "ALTER TABLE " + ib.table + " DROP CONSTRAINT IF EXISTS " + rangeCheck
	add := "ALTER TABLE " + ib.table + " ADD CONSTRAINT " + rangeCheck +
		" CHECK (coalesce(seen_at, received_at) IS NOT NULL AND coalesce(seen_at, received_at) < " + literal + ") NOT VALID"
	if err := shortSteps(ctx, conn, drop, add); err != nil {
		return fmt.Errorf("add the check of the legacy range: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE "+ib.table+" VALIDATE CONSTRAINT "+rangeCheck); err != nil {
		_ = shortSteps(context.WithoutCancel(ctx), conn, drop)
		return fmt.Errorf("validate the check of the legacy range: %w", err)
	}
	name, legacy := ib.legacy()
	half := int64(lead/time.Second) / 2
	err := shortTx(ctx, conn, func(tx pgx.Tx) error {
		var late bool
		if err := tx.QueryRow(ctx, "SELECT extract(epoch FROM now()) > $1", until-half).Scan(&late); err != nil || late {
			return cmpErr(err, errLateSwitch)
		}
		for _, s := range []string{
			"LOCK TABLE " + ib.table + " IN ACCESS EXCLUSIVE MODE",
			"ALTER TABLE " + ib.table + " RENAME TO " + pgx.Identifier{name}.Sanitize(),
			fmt.Sprintf(partitionedDDL, ib.table, pgx.Identifier{check}.Sanitize()),
			"ALTER TABLE " + ib.table + " ATTACH PARTITION " + legacy + " FOR VALUES FROM (MINVALUE) TO (" + literal + ")",
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return ib.finishLayout(ctx, tx, time.Duration(w)*time.Second, &bound)
	})
	if err != nil {
		// The check would refuse every claim once now() passes the bound:
		// it goes with the round that added it.
		if derr := shortSteps(context.WithoutCancel(ctx), conn, drop); derr != nil {
			return errors.Join(err, fmt.Errorf("drop the check of the legacy range %s: %w", rangeCheck, derr))
		}
		if errors.Is(err, errLateSwitch) {
			return errLateSwitch
		}
		return fmt.Errorf("switch to the partitioned table: %w", err)
	}
	return nil
}

// cmpErr returns err, or else alt.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// shortSteps runs each statement in a short transaction of its own (see
// shortTx).
func shortSteps(ctx context.Context, conn *pgx.Conn, stmts ...string) error {
	for _, s := range stmts {
		err := shortTx(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, s)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// shortTx runs do in a transaction whose lock waits end after
// convertLockTimeout, and tries again, convertPause later, while a lock
// is not granted in time.
func shortTx(ctx context.Context, conn *pgx.Conn, do func(tx pgx.Tx) error) error {
	var err error
	for range convertAttempts {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+convertLockTimeout+"'"); err != nil {
				return err
			}
			return do(tx)
		})
		if !isLockTimeout(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(convertPause):
		}
	}
	return fmt.Errorf("its locks were not granted in %d tries: %w", convertAttempts, err)
}

// convertKey is the advisory lock that one conversion of table holds.
func convertKey(table string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem.inbox.convert:" + table))
	return int64(h.Sum64())
}
