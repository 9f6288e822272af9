package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// A stream message whose id is not text, in its JSON body or in the
// application property a consumer reads its id from, is dead-lettered with
// reason invalid_id and a row, never processed under a repaired id; the
// stream flows on. (The Go stream client refuses to write a string that is
// not UTF-8, so the property's bad id travels as binary; a message-id
// property that is not text goes through the same check as a queue's,
// which TestIDsThatAreNotTextAreDeadLetteredAsInvalidID covers.)
func TestStreamIDsThatAreNotTextAreDeadLetteredAsInvalidID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := streamEnv(t)
	name := streamName(t, env)
	require.NoError(t, env.DeclareStream(ctx, name, streamio.StreamOptions{}))
	require.NoError(t, env.Publish(ctx, name, []streamio.Outgoing{
		{MessageID: "bad-1", Body: []byte("{\"invoiceId\":\"a\xff\"}"), ApplicationProperties: map[string]any{"x-request-id": []byte("r-\xff")}},
		{MessageID: "bad-2", Body: []byte("{\"invoiceId\":\"a\xfe\"}"), ApplicationProperties: map[string]any{"x-request-id": []byte("r-\xfe")}},
		{MessageID: "good", Body: []byte(`{"invoiceId":"good"}`), ApplicationProperties: map[string]any{"x-request-id": "good"}},
	}))

	for _, tc := range []struct {
		name string
		id   IDFunc
	}{{"by-json-field", IDFromJSONField("invoiceId")}, {"by-property", IDFromHeader("x-request-id")}} {
		e := newEnv(t)
		c := e.streamConsumer(name, e.effectHandler(), func(cfg *Config) { cfg.Name, cfg.MessageID = tc.name, tc.id })
		stop := start(t, c)
		waitFor(t, 30*time.Second, tc.name+": every message settled", func() bool {
			s := c.Stats()
			return s.Processed+s.DeadLettered == 3
		})
		stop()
		require.Equal(t, map[string]int{"good": 1}, e.effects(), tc.name)
		require.Equal(t, 2, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+
			` WHERE consumer = '`+tc.name+`' AND reason = '`+deadletters.ReasonInvalidID+`'`), tc.name)
	}
}

// A stream record the client cannot decode, whether its decoder fails
// (bytes that are not an AMQP 1.0 message) or panics (a map as a message
// annotation key), is dead-lettered alone as undecodable, with a row found
// by the hash of its bytes, within seconds: the worker lives, every other
// record, in its chunk and after it, is applied once, and the checkpoint
// reaches the tail. A publisher cannot forge the mark: a record whose
// application properties claim the reason is processed as any other.
func TestStreamRecordTheClientCannotDecodeIsDeadLetteredAloneAndTheStreamFlows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	name, publish := newStream(t)
	publish(0, 5)
	testbroker.PublishRecords(t, streamio.URLFromEnv(), name, testbroker.Record(t, "m-5", []byte(`{"n":5}`), nil),
		testbroker.MapKeyedRecord, testbroker.GarbageRecord,
		testbroker.Record(t, "m-6", []byte(`{"n":6}`), map[string]any{deadletters.HeaderReason: deadletters.ReasonUndecodable}))
	publish(7, 12) // offsets 0-4, 5 m-5, 6 map-keyed, 7 garbage, 8 m-6, 9-13 m-7 … m-11
	c := e.streamConsumer(name, e.effectHandler(), nil)
	start(t, c)
	waitFor(t, 30*time.Second, "checkpoint at the tail", func() bool { return e.checkpoint(name) == 13 })

	want := map[string]int{}
	for i := range 12 {
		want[fmt.Sprintf("m-%d", i)] = 1
	}
	require.Equal(t, want, e.effects())
	rows := map[string]string{}
	r, err := e.pool.Query(context.Background(), `SELECT message_id, reason FROM `+e.tables.Table("dead_letters"))
	require.NoError(t, err)
	for r.Next() {
		var id, reason string
		require.NoError(t, r.Scan(&id, &reason))
		rows[id] = reason
	}
	require.NoError(t, r.Err())
	require.Equal(t, map[string]string{
		"sha256:" + idem.HashBytes(testbroker.MapKeyedRecord).String(): deadletters.ReasonUndecodable,
		"sha256:" + idem.HashBytes(testbroker.GarbageRecord).String():  deadletters.ReasonUndecodable,
	}, rows)
	s := c.Stats()
	require.EqualValues(t, 2, s.DeadLettered)
	require.EqualValues(t, 12, s.Processed)
}
