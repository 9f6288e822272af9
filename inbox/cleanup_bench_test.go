package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// fillScope inserts n rows under consumer "live", then n under "scope"
// (ids as a rebuild writes them, after the live worker wrote its own),
// analyzes the table and checkpoints, as a rebuild leaves it.
func fillScope(b *testing.B, pool *pgxpool.Pool, tables idem.Tables, n int) {
	b.Helper()
	for _, consumer := range []string{"live", "scope"} {
		_, err := pool.Exec(b.Context(), "INSERT INTO "+tables.Table("inbox")+` (consumer, message_id, payload_hash, source, stream_offset)
			SELECT $2, 'evt-' || lpad(i::text, 9, '0'), sha256(i::text::bytea), 's', i
			FROM generate_series(1, $1) AS i`, n, consumer)
		require.NoError(b, err)
	}
	_, err := pool.Exec(b.Context(), "ANALYZE "+tables.Table("inbox"))
	require.NoError(b, err)
	// The rows a rebuild wrote are on disk by the time it swaps (a
	// checkpoint comes every few minutes): the clean-up must not pay for
	// writing out the fill's dirty pages, which only a fill larger than
	// shared_buffers would make it do.
	_, err = pool.Exec(b.Context(), "CHECKPOINT")
	require.NoError(b, err)
}

// rescanSQL is the baseline: a chunked delete whose chunks each look for
// rows from the start of the scope, so that each reads again the dead
// index entries of every chunk before it.
const rescanSQL = `DELETE FROM %[1]s WHERE consumer = $1 AND message_id IN (
	SELECT message_id FROM %[1]s WHERE consumer = $1 LIMIT $2)`

// BenchmarkDeleteScope deletes a rebuild's scope of 300k and 1M rows with
// DeleteScope, whose chunks each start after the last key the one before
// deleted, against the rescanning statement (baseline=rescan), while
// another session holds a snapshot (a live worker's or a reader's
// transaction), so that the deleted rows' index entries cannot be marked
// dead as they are passed. The seconds per scope should grow with the
// rows: 1M within about 4× of 300k.
func BenchmarkDeleteScope(b *testing.B) {
	for _, n := range []int{300_000, 1_000_000} {
		for _, how := range []string{"bound", "rescan"} {
			b.Run(fmt.Sprintf("rows=%d/%s", n, how), func(b *testing.B) {
				var total time.Duration
				for b.Loop() {
					b.StopTimer()
					pool, tables := testdb.Schema(b)
					ib, err := inbox.New(inbox.Config{Tables: tables})
					require.NoError(b, err)
					fillScope(b, pool, tables, n)
					snapshot, err := pool.Begin(b.Context())
					require.NoError(b, err)
					_, err = snapshot.Exec(b.Context(), "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM "+tables.Table("inbox"))
					require.NoError(b, err)
					b.StartTimer()
					start := time.Now()
					if how == "bound" {
						deleted, err := ib.DeleteScope(b.Context(), pool, "scope")
						require.NoError(b, err)
						require.EqualValues(b, n, deleted)
					} else {
						for {
							tag, err := pool.Exec(b.Context(), fmt.Sprintf(rescanSQL, tables.Table("inbox")), "scope", 5000)
							require.NoError(b, err)
							if tag.RowsAffected() < 5000 {
								break
							}
						}
					}
					total += time.Since(start)
					require.NoError(b, snapshot.Rollback(b.Context()))
				}
				b.ReportMetric(total.Seconds()/float64(b.N), "s/scope")
			})
		}
	}
}
