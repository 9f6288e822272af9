package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// fillHistory gives a plain inbox n rows claimed three days ago (ids
// old-0 … old-n-1 of consumer c, hashed as their id) and analyzes it.
func fillHistory(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, n int) {
	t.Helper()
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash, source, received_at)
SELECT 'c', 'old-' || i, sha256(convert_to('old-' || i, 'UTF8')), 's', now() - interval '3 days' + i * interval '1 millisecond'
FROM generate_series(0, $1::int - 1) AS i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+tables.Table("inbox"))
	require.NoError(t, err)
	require.Equal(t, hash("old-7"), stored(t, pool, tables, "c", "old-7"), "the filled hashes are those of hash()")
}

// stored returns the hash stored for id.
func stored(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, consumer, id string) idem.Hash {
	t.Helper()
	var raw []byte
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT payload_hash FROM `+tables.Table("inbox")+
		` WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&raw))
	h, err := idem.HashFromBytes(raw)
	require.NoError(t, err)
	return h
}

// claimer claims batches the way the runtime does, with an Inbox of its
// own (a worker process that read the layout before the conversion): a
// plain INSERT first, ClaimBatch when a message was claimed before, the
// batch again when the layout changed. It applies each new message once,
// as a row of the effects table, in the claim's transaction.
type claimer struct {
	ib      *inbox.Inbox
	pool    *pgxpool.Pool
	effects string
	changed atomic.Int64 // batches that met ErrLayoutChanged
	batches atomic.Int64
}

func (c *claimer) claim(ctx context.Context, claims []inbox.Claim, newOnly bool) error {
	for range 10 {
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			var res []inbox.Result
			var err error
			if newOnly {
				res, err = c.ib.ClaimNewBatch(ctx, tx, claims)
			} else {
				res, err = c.ib.ClaimBatch(ctx, tx, claims)
			}
			if err != nil {
				return err
			}
			for i, r := range res {
				if r.Decision == inbox.NewMessage {
					if _, err := tx.Exec(ctx, "INSERT INTO "+c.effects+" (consumer, message_id) VALUES ($1, $2)",
						claims[i].Consumer, claims[i].MessageID); err != nil {
						return err
					}
				}
			}
			return nil
		})
		switch {
		case err == nil:
			c.batches.Add(1)
			return nil
		case errors.Is(err, inbox.ErrClaimed):
			newOnly = false
		case errors.Is(err, inbox.ErrLayoutChanged):
			c.changed.Add(1)
		default:
			return err
		}
	}
	return fmt.Errorf("batch not claimed in 10 tries")
}

// A worker's inbox of history is converted to the partitioned layout while
// four claimers run, each with its own Inbox that read the plain layout:
// every message is applied once (new ones, and the shared ones all four
// claim at once), none of the history is applied again, whether its copy
// comes before the switch, after it, or after the time partitions begin, and
// no claim fails.
func TestConvertingAnInboxWithHistoryWhileClaimersRunAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	const (
		history = 50_000
		width   = 2 * time.Second
		lead    = 3 * time.Second
	)
	pool, _, tables := setup(t)
	ctx := t.Context()
	fillHistory(t, pool, tables, history)
	effects := tables.Table("effects")
	_, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (consumer text, message_id text)")
	require.NoError(t, err)

	claimers := make([]*claimer, 4)
	for i := range claimers {
		ib, err := inbox.New(inbox.Config{Tables: tables})
		require.NoError(t, err)
		claimers[i] = &claimer{ib: ib, pool: pool, effects: effects}
		require.NoError(t, claimers[i].claim(ctx, []inbox.Claim{{Consumer: "c", MessageID: fmt.Sprintf("warm-%d", i), PayloadHash: hash("w"), Source: "s"}}, true))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(claimers))
	var rounds atomic.Int64
	for w, c := range claimers {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				var claims []inbox.Claim
				add := func(id string) {
					claims = append(claims, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id), Source: "s"})
				}
				for j := range 5 {
					add(fmt.Sprintf("new-%d-%d-%d", w, k, j))
				}
				add(fmt.Sprintf("shared-%d", k))               // every claimer claims it at about the same time
				add(fmt.Sprintf("old-%d", (k*7919+w)%history)) // a copy of the history
				// Half the claimers start with a plain INSERT, half with
				// ClaimBatch, which meets the conversion as an error.
				if err := c.claim(ctx, claims, w%2 == 0); err != nil {
					errs <- fmt.Errorf("claimer %d, batch %d: %w", w, k, err)
					return
				}
				rounds.Add(1)
			}
		})
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	waitRounds := func(n int64) {
		deadline := time.Now().Add(time.Minute)
		for start := rounds.Load(); rounds.Load() < start+n; time.Sleep(10 * time.Millisecond) {
			require.True(t, time.Now().Before(deadline), "the claimers made no progress")
		}
	}
	waitRounds(50)

	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	require.NoError(t, inbox.ConvertNarrow(ctx, ib, pool, width, lead))
	waitRounds(50)
	// Past the legacy partition's bound, into the time partitions, which
	// retention (here EnsurePartitions) makes as time goes.
	var until time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT legacy_until FROM "+tables.Table("inbox_layout")).Scan(&until))
	for deadline := time.Now().Add(time.Minute); time.Now().Before(until.Add(2 * width)); time.Sleep(500 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the legacy bound %v did not pass", until)
		_, err := ib.EnsurePartitions(ctx, pool, 0)
		require.NoError(t, err)
	}
	waitRounds(50)
	halt()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	for i, c := range claimers {
		require.LessOrEqual(t, c.changed.Load(), int64(1), "claimer %d met the conversion once at most", i)
	}
	var twice, applied, old int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n > 1), count(*), count(*) FILTER (WHERE message_id LIKE 'old-%')
FROM (SELECT message_id, count(*) AS n FROM `+effects+` GROUP BY message_id) AS e`).Scan(&twice, &applied, &old))
	require.Zero(t, twice, "a message applied twice")
	require.Zero(t, old, "a message of the history applied again")
	var rows, keys int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT message_id) FROM "+tables.Table("inbox")).Scan(&rows, &keys))
	require.Equal(t, rows, keys, "one row per message across the partitions")
	require.Equal(t, int64(history)+applied, rows, "every applied message has its row, and the history is kept")

	var legacy, timed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tableoid::regclass::text LIKE '%inbox_legacy%'),
	count(*) FILTER (WHERE tableoid::regclass::text LIKE '%inbox_p%') FROM `+tables.Table("inbox")).Scan(&legacy, &timed))
	require.Positive(t, timed, "claims reached the time partitions")
	require.Positive(t, legacy)
	t.Logf("%d messages applied, %d rows left in the legacy partition, %d in time partitions", applied, legacy, timed)
}

// The conversion never queues claims behind its exclusive locks for long:
// while a transaction that claimed holds its lock on the inbox for ten
// seconds, every switch attempt gives up its place within its lock timeout,
// so other claims go on, and the conversion completes once that
// transaction ends.
func TestConvertingAnInboxBlocksClaimsOnlyBriefly(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	fillHistory(t, pool, tables, 20_000)

	// A long transaction that claimed, holding its lock on the table.
	long, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = ib.Claim(ctx, long, inbox.Claim{Consumer: "c", MessageID: "long", PayloadHash: hash("long"), Source: "s"})
	require.NoError(t, err)
	release := time.AfterFunc(10*time.Second, func() { _ = long.Commit(context.WithoutCancel(ctx)) })
	defer release.Stop()

	probe, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	prober := probeClaims(ctx, t, pool, 20*time.Millisecond, "c", "s", func(ctx context.Context, tx pgx.Tx, c inbox.Claim) error {
		_, err := probe.ClaimNewBatch(ctx, tx, []inbox.Claim{c})
		return err
	})
	start := time.Now()
	err = inbox.ConvertNarrow(ctx, ib, pool, 2*time.Second, 30*time.Second)
	took := time.Since(start)
	probes, worst := prober.end()
	require.NoError(t, err)
	require.Greater(t, took, 9*time.Second, "the switch waited for the long transaction")
	t.Logf("conversion took %v; the slowest of %d probe claims took %v", took.Round(time.Millisecond), probes, worst.Round(time.Millisecond))
	require.Greater(t, probes, int64(20), "claims went on during the conversion")
	// The lock timeout of a step is half a second; a claim queued behind a
	// switch that waited for the long transaction would have waited ten.
	require.Less(t, worst, 4*time.Second, "a claim waited behind the conversion")

	var parted bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)", tables.Table("inbox")).Scan(&parted))
	require.True(t, parted)
	res, err := probe.LookupClaims(ctx, pool, []inbox.Claim{{Consumer: "c", MessageID: "long", PayloadHash: hash("long")}})
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res[0].Decision, "the long transaction's claim is in the legacy partition")
}

// Retention on a converted inbox deletes the expired rows of the legacy
// partition in chunks while its bound is after the cutoff, then drops it
// whole, recording its horizon; a message whose row moved out of it with a
// later copy is still a duplicate.
func TestCleanupOfAConvertedInboxDeletesLegacyRowsThenDropsTheLegacyPartition(t *testing.T) {
	t.Parallel()
	const width = 2 * time.Second
	pool, ib, tables := setup(t)
	ctx := t.Context()
	fillHistory(t, pool, tables, 1000)
	for i := range int64(3) {
		id := fmt.Sprintf("young-%d", i)
		claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id), Source: "s", StreamOffset: at(100 + i)})
	}
	require.NoError(t, inbox.ConvertNarrow(ctx, ib, pool, width, 3*time.Second))

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Hour, Floor: time.Hour})
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 1000, Chunks: 1}, res, "the history deleted in chunks; the legacy partition is kept")
	h, ok, err := ib.Horizon(ctx, pool, "c", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(-72*time.Hour), h.SeenAt, time.Hour)

	var until time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT legacy_until FROM "+tables.Table("inbox_layout")).Scan(&until))
	for deadline := time.Now().Add(time.Minute); time.Now().Before(until.Add(time.Second)); time.Sleep(200 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the legacy bound %v did not pass", until)
	}
	_, err = ib.EnsurePartitions(ctx, pool, 0)
	require.NoError(t, err)
	// A later copy of young-0 moves its row out of the legacy partition.
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "young-0", PayloadHash: hash("young-0"), Source: "s", StreamOffset: at(200)}).Decision)
	require.NotContains(t, partitionOf(t, pool, tables, "c", "young-0"), "inbox_legacy")
	time.Sleep(time.Second)

	res, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Second, Floor: time.Second})
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Partitions, 1)
	require.GreaterOrEqual(t, res.Deleted, int64(2), "young-1 and young-2, with the legacy partition")
	var legacy *string
	var bound *time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1)::text, (SELECT legacy_until FROM "+tables.Table("inbox_layout")+")",
		tables.Table("inbox_legacy")).Scan(&legacy, &bound))
	require.Nil(t, legacy, "the legacy partition is dropped")
	require.Nil(t, bound)
	h, ok, err = ib.Horizon(ctx, pool, "c", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.GreaterOrEqual(t, *h.Offset, int64(102), "the horizon covers the rows of the legacy partition")
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "young-0", PayloadHash: hash("young-0"), Source: "s"}).Decision)
}

// A pool of one connection converts too: the conversion gives its
// connection back before it makes the partitions.
func TestConvertingWithAPoolOfOneConnection(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	fillHistory(t, pool, tables, 100)
	cfg := pool.Config()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer one.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, ib.ConvertPartitioned(ctx, one, time.Hour))
	made, err := ib.EnsurePartitions(ctx, one, 0)
	require.NoError(t, err)
	require.Zero(t, made, "the conversion made the partitions ahead")
}

// claimProber claims a new message every interval, each in a transaction
// of its own, while a test changes the inbox under it, and keeps the
// slowest claim. A claim that meets ErrLayoutChanged (once, at the
// switch) is not counted; any other error fails the test.
type claimProber struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	worst  atomic.Int64
	probes atomic.Int64
}

// probeClaims starts a claimProber of consumer's messages from source,
// claimed with claim on pool.
func probeClaims(ctx context.Context, t *testing.T, pool *pgxpool.Pool, every time.Duration, consumer, source string,
	claim func(ctx context.Context, tx pgx.Tx, c inbox.Claim) error) *claimProber {
	p := &claimProber{stop: make(chan struct{})}
	p.wg.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			start := time.Now()
			c := inbox.Claim{Consumer: consumer, MessageID: fmt.Sprintf("probe-%d", k), PayloadHash: hash("p"), Source: source}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return claim(ctx, tx, c) })
			if errors.Is(err, inbox.ErrLayoutChanged) {
				continue // once; the next claim takes the partitioned layout
			}
			if err != nil {
				t.Errorf("probe claim %d: %v", k, err)
				return
			}
			if d := time.Since(start); d > time.Duration(p.worst.Load()) {
				p.worst.Store(int64(d))
			}
			p.probes.Add(1)
		}
	})
	return p
}

// end stops the claims and returns how many there were and the slowest.
func (p *claimProber) end() (probes int64, worst time.Duration) {
	close(p.stop)
	p.wg.Wait()
	return p.probes.Load(), time.Duration(p.worst.Load())
}
