package consumer

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

// BenchmarkProcessBatch runs batches of new messages through the batch
// pipeline (hash, identity, claim, savepoint-free handler loop, deferred
// UPDATE, commit) on the real database, without a broker. Its allocs/op and
// B/op are the runtime's own per-batch garbage; ns/msg includes PostgreSQL.
//
//	go test ./consumer -run '^$' -bench ProcessBatch -benchmem
func BenchmarkProcessBatch(b *testing.B) {
	for _, size := range []int{1, 128} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			ctx := context.Background()
			pool, tables := testdb.Schema(b)
			accounts := tables.QuotedSchema() + ".accounts"
			_, err := pool.Exec(ctx, `CREATE TABLE `+accounts+` (id int PRIMARY KEY, balance bigint NOT NULL);
				INSERT INTO `+accounts+` SELECT g, 0 FROM generate_series(0, 999) g`)
			if err != nil {
				b.Fatal(err)
			}
			update := `UPDATE ` + accounts + ` SET balance = balance + 1 WHERE id = $1`
			c, err := New(Config{Name: "bench", Pool: pool, Tables: tables, Logger: testLogger()})
			if err != nil {
				b.Fatal(err)
			}
			c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
				return Defer(ctx, tx, update, int32(binary.BigEndian.Uint32(m.Body)%1000))
			})
			all := make([]Message, b.N*size) // built before the clock runs
			for n := range all {
				body := make([]byte, 256)
				binary.BigEndian.PutUint32(body, uint32(n))
				all[n] = Message{MessageID: fmt.Sprintf("m-%d", n), Body: body}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				out, err := c.Process(ctx, all[i*size:(i+1)*size])
				if err != nil {
					b.Fatal(err)
				}
				for _, o := range out {
					if o.Outcome.String() != "processed" {
						b.Fatalf("outcome %+v", o)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/msg")
		})
	}
}
