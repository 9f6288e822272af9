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

// Message returns a message with message-id id and raw body.
func Message(id string, body []byte) consumer.Message {
	return consumer.Message{MessageID: id, Body: body}
}

// MessageJSON returns a message with message-id id and v encoded as its
// JSON body.
func MessageJSON(id string, v any) consumer.Message {
	body, err := json.Marshal(v)
	if err != nil {
		panic("consumertest: encode message body: " + err.Error())
	}
	return consumer.Message{MessageID: id, Body: body, ContentType: "application/json"}
}

// Times returns n copies of m, as a broker redelivering it would.
func Times(n int, m consumer.Message) []consumer.Message {
	out := make([]consumer.Message, n)
	for i := range out {
		out[i] = m
		out[i].Redelivered = i > 0
	}
	return out
}

// Deliver processes msgs as one batch through c (see consumer.Consumer.Process)
// and returns their results in order. The test fails if the batch itself fails.
func Deliver(tb testing.TB, c *consumer.Consumer, msgs ...consumer.Message) []consumer.Result {
	tb.Helper()
	out, err := c.Process(context.Background(), msgs)
	if err != nil {
		tb.Fatalf("consumertest: deliver %d messages: %v", len(msgs), err)
	}
	return out
}

// DeliverEach processes every message in its own batch, in order, as a
// broker delivering them one by one would.
func DeliverEach(tb testing.TB, c *consumer.Consumer, msgs ...consumer.Message) []consumer.Result {
	tb.Helper()
	var all []consumer.Result
	for _, m := range msgs {
		all = append(all, Deliver(tb, c, m)...)
	}
	return all
}

// Outcomes returns how many results ended with each outcome.
func Outcomes(res []consumer.Result) map[idem.Outcome]int {
	m := map[idem.Outcome]int{}
	for _, r := range res {
		m[r.Outcome]++
	}
	return m
}

// RequireProcessed fails the test unless exactly one result for message id
// id is idem.Processed: the handler's effect happened once.
func RequireProcessed(tb testing.TB, res []consumer.Result, id string) {
	tb.Helper()
	if n := count(res, id, idem.Processed, ""); n != 1 {
		tb.Fatalf("consumertest: message %q processed %d times, want once; results: %s", id, n, describe(res))
	}
}

// RequireDuplicates fails the test unless n results for id are
// idem.Duplicate.
func RequireDuplicates(tb testing.TB, res []consumer.Result, id string, n int) {
	tb.Helper()
	if got := count(res, id, idem.Duplicate, ""); got != n {
		tb.Fatalf("consumertest: message %q had %d duplicates, want %d; results: %s", id, got, n, describe(res))
	}
}

// RequireDeadLettered fails the test unless some result for id is
// idem.DeadLettered with reason (see package deadletters for the runtime's
// reasons).
func RequireDeadLettered(tb testing.TB, res []consumer.Result, id, reason string) {
	tb.Helper()
	if count(res, id, idem.DeadLettered, reason) == 0 {
		tb.Fatalf("consumertest: message %q not dead-lettered with reason %q; results: %s", id, reason, describe(res))
	}
}

func count(res []consumer.Result, id string, outcome idem.Outcome, reason string) int {
	n := 0
	for _, r := range res {
		if r.Message.ID == id && r.Outcome == outcome && (reason == "" || r.Reason == reason) {
			n++
		}
	}
	return n
}

func describe(res []consumer.Result) string {
	b, _ := json.Marshal(func() []map[string]string {
		var rows []map[string]string
		for _, r := range res {
			row := map[string]string{"id": r.Message.ID, "outcome": r.Outcome.String()}
			if r.Reason != "" {
				row["reason"] = r.Reason
			}
			if r.Err != nil {
				row["error"] = r.Err.Error()
			}
			rows = append(rows, row)
		}
		return rows
	}())
	return string(b)
}
