package inbox_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// walHistory is how many rows of history each inbox of BenchmarkInboxWALByIDKind
// holds: an index larger than shared_buffers (128 MB here).
const walHistory = 2_000_000

// walInbox is one inbox of BenchmarkInboxWALByIDKind and the ids it claims.
type walInbox struct {
	name  string
	pool  *pgxpool.Pool
	ib    *inbox.Inbox
	newID func() string
	wal   int64 // bytes of WAL written while it claimed
}

// BenchmarkInboxWALByIDKind measures the write-ahead log a claim writes with random
// message ids (UUIDv4) and with time-ordered ones (UUIDv7,
// idem.NewMessageID), each on an inbox of two million rows of history of
// its own kind. It starts after a CHECKPOINT, as every checkpoint starts
// again: the first change of an index page after it writes the whole page
// to the log. One op is a committed ClaimNewBatch of 100 new ids in each
// inbox, one after the other, so that the WAL other connections to the server
// write meanwhile falls on both alike; the WAL is the difference of
// pg_current_wal_lsn() around each batch. Run with -benchtime 300x: the
// inboxes are filled once (b.Loop).
func BenchmarkInboxWALByIDKind(b *testing.B) {
	const batch = 100
	inboxes := []*walInbox{
		{name: "v4", newID: uuid.NewString},
		{name: "v7", newID: idem.NewMessageID},
	}
	ctx := b.Context()
	for _, w := range inboxes {
		pool, tables := testdb.Schema(b)
		ib, err := inbox.New(inbox.Config{Tables: tables})
		require.NoError(b, err)
		w.pool, w.ib = pool, ib
		// The history: random ids, or ids ordered by a time before now,
		// as UUIDv7 spells them.
		id := `gen_random_uuid()::text`
		if w.name == "v7" {
			id = `substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12)`
		}
		_, err = pool.Exec(ctx, `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash, source)
SELECT 'bench', `+id+`, sha256(int8send(i)), 'orders'
FROM (SELECT i, lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - $1 + i), 12, '0') AS h, md5(i::text) AS r
	FROM generate_series(1, $1::bigint) AS i) AS s`, walHistory)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `ANALYZE `+tables.Table("inbox"))
		require.NoError(b, err)
	}
	pool := testdb.Pool(b)
	_, err := pool.Exec(ctx, "CHECKPOINT")
	require.NoError(b, err)
	lsn := func() int64 {
		var n int64
		require.NoError(b, pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").Scan(&n))
		return n
	}
	claims := make([]inbox.Claim, batch)
	n := 0
	for b.Loop() {
		n++
		for _, w := range inboxes {
			for i := range claims {
				id := w.newID()
				claims[i] = inbox.Claim{Consumer: "bench", MessageID: id, PayloadHash: idem.HashBytes([]byte(id)), Source: "orders"}
			}
			before := lsn()
			require.NoError(b, pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
				_, err := w.ib.ClaimNewBatch(ctx, tx, claims)
				return err
			}))
			w.wal += lsn() - before
		}
	}
	claimed := float64(n * batch)
	v4, v7 := float64(inboxes[0].wal)/claimed, float64(inboxes[1].wal)/claimed
	b.ReportMetric(v4, "v4-WAL-B/claim")
	b.ReportMetric(v7, "v7-WAL-B/claim")
	b.ReportMetric(v7/v4, "v7/v4")
}
