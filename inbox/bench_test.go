package inbox_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

func benchInbox(b *testing.B) (*inbox.Inbox, func(func(pgx.Tx) error)) {
	b.Helper()
	pool, tables := testdb.Schema(b)
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(b, err)
	inTx := func(f func(pgx.Tx) error) {
		require.NoError(b, pgx.BeginFunc(b.Context(), pool, f))
	}
	return ib, inTx
}

func benchClaim(n int) inbox.Claim {
	id := fmt.Sprintf("msg-%09d", n)
	return inbox.Claim{Consumer: "bench", MessageID: id, PayloadHash: idem.HashBytes([]byte(id)), Source: "orders"}
}

// BenchmarkClaimSingle is the baseline: one Claim per committed transaction,
// so every row pays a commit (fsync) and a round trip.
func BenchmarkClaimSingle(b *testing.B) {
	ib, inTx := benchInbox(b)
	n := 0
	for b.Loop() {
		c := benchClaim(n)
		n++
		inTx(func(tx pgx.Tx) error {
			_, err := ib.Claim(b.Context(), tx, c)
			return err
		})
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkClaimSingleInTx claims size messages with one Claim each inside one
// transaction: one commit per batch, but a round trip per row.
func BenchmarkClaimSingleInTx(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ib, inTx := benchInbox(b)
			n := 0
			for b.Loop() {
				inTx(func(tx pgx.Tx) error {
					for range size {
						if _, err := ib.Claim(b.Context(), tx, benchClaim(n)); err != nil {
							return err
						}
						n++
					}
					return nil
				})
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkClaimBatch claims size messages with one ClaimBatch per committed
// transaction: one statement and one commit per batch.
func BenchmarkClaimBatch(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ib, inTx := benchInbox(b)
			n := 0
			batch := make([]inbox.Claim, size)
			for b.Loop() {
				for i := range batch {
					batch[i] = benchClaim(n)
					n++
				}
				inTx(func(tx pgx.Tx) error {
					_, err := ib.ClaimBatch(b.Context(), tx, batch)
					return err
				})
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkClaimNewBatchPartitioned claims batches of 200 new messages with
// ClaimNewBatch per committed transaction on an inbox laid out in
// partitions a minute wide (the partition of now and four ahead, and the
// default one): the pipeline's claim, in the partitioned layout.
func BenchmarkClaimNewBatchPartitioned(b *testing.B) {
	pool, tables := testdb.Schema(b)
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(b, err)
	require.NoError(b, pgx.BeginFunc(b.Context(), pool, func(tx pgx.Tx) error {
		return ib.LayOutPartitioned(b.Context(), tx, inbox.MinPartitionWidth)
	}))
	_, err = ib.EnsurePartitions(b.Context(), pool, 0)
	require.NoError(b, err)
	n := 0
	batch := make([]inbox.Claim, 200)
	for b.Loop() {
		for i := range batch {
			batch[i] = benchClaim(n)
			n++
		}
		require.NoError(b, pgx.BeginFunc(b.Context(), pool, func(tx pgx.Tx) error {
			_, err := ib.ClaimNewBatch(b.Context(), tx, batch)
			return err
		}))
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
}
