package consumertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/migrate"
)

// Schema creates a fresh schema holding idem's tables, migrated, and drops
// it when the test ends. Pass the result as Config.Tables (and create your
// own business tables in it, or anywhere else).
func Schema(tb testing.TB, pool *pgxpool.Pool) idem.Tables {
	tb.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("consumertest: random schema name: %v", err)
	}
	tables := idem.Tables{Schema: "idemtest_" + hex.EncodeToString(b[:])}
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		tb.Fatalf("consumertest: migrate: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE"); err != nil {
			tb.Errorf("consumertest: drop schema %s: %v", tables.Schema, err)
		}
	})
	return tables
}

// Incoming returns a message with id and raw body.
func Incoming(id string, body []byte) consumer.Incoming {
	return consumer.Incoming{MessageID: id, Body: body}
}

// IncomingJSON returns a message with id and v encoded as its JSON body.
func IncomingJSON(id string, v any) consumer.Incoming {
	body, err := json.Marshal(v)
	if err != nil {
		panic("consumertest: encode message body: " + err.Error())
	}
	return consumer.Incoming{MessageID: id, Body: body, ContentType: "application/json"}
}

// Times returns n copies of m, as a broker redelivering it would.
func Times(n int, m consumer.Incoming) []consumer.Incoming {
	out := make([]consumer.Incoming, n)
	for i := range out {
		out[i] = m
		out[i].Redelivered = i > 0
	}
	return out
}

// Deliver processes msgs as one batch through c (see consumer.Consumer.Process)
// and returns their outcomes in order. The test fails if the batch itself fails.
func Deliver(tb testing.TB, c *consumer.Consumer, msgs ...consumer.Incoming) []consumer.Outcome {
	tb.Helper()
	out, err := c.Process(context.Background(), msgs)
	if err != nil {
		tb.Fatalf("consumertest: deliver %d messages: %v", len(msgs), err)
	}
	return out
}

// DeliverEach processes every message in its own batch, in order, as a
// broker delivering them one by one would.
func DeliverEach(tb testing.TB, c *consumer.Consumer, msgs ...consumer.Incoming) []consumer.Outcome {
	tb.Helper()
	var all []consumer.Outcome
	for _, m := range msgs {
		all = append(all, Deliver(tb, c, m)...)
	}
	return all
}

// Results returns how many outcomes ended with each result.
func Results(out []consumer.Outcome) map[consumer.Result]int {
	m := map[consumer.Result]int{}
	for _, o := range out {
		m[o.Result]++
	}
	return m
}

// RequireProcessed fails the test unless exactly one outcome for id is
// consumer.Processed: the handler's effect happened once.
func RequireProcessed(tb testing.TB, out []consumer.Outcome, id string) {
	tb.Helper()
	if n := count(out, id, consumer.Processed, ""); n != 1 {
		tb.Fatalf("consumertest: message %q processed %d times, want once; outcomes: %s", id, n, describe(out))
	}
}

// RequireDuplicates fails the test unless n outcomes for id are
// consumer.Duplicate.
func RequireDuplicates(tb testing.TB, out []consumer.Outcome, id string, n int) {
	tb.Helper()
	if got := count(out, id, consumer.Duplicate, ""); got != n {
		tb.Fatalf("consumertest: message %q had %d duplicates, want %d; outcomes: %s", id, got, n, describe(out))
	}
}

// RequireDeadLettered fails the test unless some outcome for id is
// consumer.DeadLettered with reason (see package deadletters for the
// runtime's reasons).
func RequireDeadLettered(tb testing.TB, out []consumer.Outcome, id, reason string) {
	tb.Helper()
	if count(out, id, consumer.DeadLettered, reason) == 0 {
		tb.Fatalf("consumertest: message %q not dead-lettered with reason %q; outcomes: %s", id, reason, describe(out))
	}
}

func count(out []consumer.Outcome, id string, result consumer.Result, reason string) int {
	n := 0
	for _, o := range out {
		if o.MessageID == id && o.Result == result && (reason == "" || o.Reason == reason) {
			n++
		}
	}
	return n
}

func describe(out []consumer.Outcome) string {
	b, _ := json.Marshal(func() []map[string]string {
		var rows []map[string]string
		for _, o := range out {
			row := map[string]string{"id": o.MessageID, "result": o.Result.String()}
			if o.Reason != "" {
				row["reason"] = o.Reason
			}
			if o.Err != nil {
				row["error"] = o.Err.Error()
			}
			rows = append(rows, row)
		}
		return rows
	}())
	return string(b)
}
