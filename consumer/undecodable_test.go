package consumer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// nestedTable is a header table nested depth tables deep: amqp091-go
// refuses a table nested deeper than 32 and closes the connection, the
// broker takes and relays it.
func nestedTable(depth int) amqp.Table {
	t := amqp.Table{"leaf": "x"}
	for range depth {
		t = amqp.Table{"n": t}
	}
	return t
}

// poison is one message the client library cannot decode, among good ones.
type poison struct {
	id      string // "" publishes it without a message id
	body    string
	headers amqp.Table
	// rawL, set, turns the header rawHeader's field type from 'l' (int64)
	// into 'L' on the wire: a type RabbitMQ takes and relays and amqp091-go
	// does not know, and cannot send.
	rawL bool
}

// rawHeader is the header a rawL poison carries, as an int64.
const rawHeader = "idem-raw-field"

// publishAmong publishes four good messages, the poisons, then five good
// messages, and returns the good ids.
func (e *env) publishAmong(poisons ...poison) []string {
	e.t.Helper()
	var good []string
	for i := range 9 {
		if i == 4 {
			for _, p := range poisons {
				e.publishPoison(p)
			}
		}
		id := fmt.Sprintf("good-%d", i)
		good = append(good, id)
		e.publish(id, fmt.Sprintf(`{"n":%d}`, i), amqp.Table{"ok": "yes"})
	}
	return good
}

func (e *env) publishPoison(p poison) {
	e.t.Helper()
	msg := amqp.Publishing{MessageId: p.id, Body: []byte(p.body), Headers: p.headers, DeliveryMode: amqp.Persistent}
	if !p.rawL {
		require.NoError(e.t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, msg))
		return
	}
	ch := rawChannel(e.t, []byte(rawHeader+"l"), []byte(rawHeader+"L"))
	msg.Headers[rawHeader] = int64(7)
	require.NoError(e.t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.queue, false, false, msg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acked, err := dc.WaitContext(ctx)
	require.NoError(e.t, err)
	require.True(e.t, acked, "the broker takes the 'L' field")
}

// rawChannel opens a channel on a connection whose writes have every from
// replaced by to (of the same length): it sends what amqp091-go cannot.
func rawChannel(t *testing.T, from, to []byte) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig(testbroker.URL(), amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		return &replacingConn{Conn: c, from: from, to: to}, nil
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// replacingConn replaces from by to in what it writes.
type replacingConn struct {
	net.Conn
	from, to []byte
}

func (c *replacingConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.from) {
		q := bytes.ReplaceAll(p, c.from, c.to)
		if _, err := c.Conn.Write(q); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// deadLetterRow is a dead-letter row as an operator reads it.
type deadLetterRow struct{ messageID, reason, errText string }

func (e *env) deadLetterRows() []deadLetterRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT message_id, reason, error FROM `+e.tables.Table("dead_letters")+` ORDER BY message_id`)
	require.NoError(e.t, err)
	defer rows.Close()
	var out []deadLetterRow
	for rows.Next() {
		var r deadLetterRow
		require.NoError(e.t, rows.Scan(&r.messageID, &r.reason, &r.errText))
		out = append(out, r)
	}
	require.NoError(e.t, rows.Err())
	return out
}

// requireUndecodableAlone checks what invariant 22 promises once the
// consumer settled everything: each poison dead-lettered with reason
// undecodable, a row found by rowIDs[i], its body in the dead-letter
// copy; every good message applied once; nothing else dead-lettered; no
// session lost; the consumer ready.
func requireUndecodableAlone(t *testing.T, e *env, c *Consumer, good []string, poisons []poison, rowIDs []string) {
	t.Helper()
	want := map[string]int{}
	for _, id := range good {
		want[id] = 1
	}
	require.Equal(t, want, e.effects(), "every good message applied once")

	rows := e.deadLetterRows()
	require.Len(t, rows, len(poisons), "one row per poison, nothing else: %+v", rows)
	byID := map[string]deadLetterRow{}
	for _, r := range rows {
		byID[r.messageID] = r
	}
	for _, id := range rowIDs {
		require.Contains(t, byID, id)
		require.Equal(t, deadletters.ReasonUndecodable, byID[id].reason)
		require.Contains(t, byID[id].errText, "headers")
	}

	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, len(poisons), "only the poisons in the dead-letter queue")
	bodies := map[string]bool{}
	for _, d := range dlq {
		require.Equal(t, deadletters.ReasonUndecodable, d.Headers[deadletters.HeaderReason])
		bodies[string(d.Body)] = true
	}
	for _, p := range poisons {
		require.True(t, bodies[p.body], "the dead-letter copy keeps the body %q", p.body)
	}
	s := c.Stats()
	require.EqualValues(t, len(poisons), s.DeadLettered)
	require.Zero(t, s.Reconnects, "no broker session died")
	waitFor(t, 10*time.Second, "the consumer ready", func() bool { return c.Health().Ready })
}

func TestUndecodableHeaderIsDeadLetteredAloneWithARowAndTheQueueFlows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"defaults", nil},
		{"delivery limit 5", func(cfg *Config) { cfg.DeliveryLimit = 5 }},
		{"classic queue", func(cfg *Config) { cfg.QueueType = "classic" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declare(tc.edit)
			p := poison{id: "nested-40", body: `{"poison":true}`, headers: amqp.Table{"deep": nestedTable(40)}}
			good := e.publishAmong(p)
			c := e.newConsumer(e.effectHandler(), tc.edit)
			start(t, c)
			waitFor(t, 30*time.Second, "the good messages applied and the poison dead-lettered", func() bool {
				s := c.Stats()
				return s.Processed == int64(len(good)) && s.DeadLettered == 1
			})
			requireUndecodableAlone(t, e, c, good, []poison{p}, []string{"nested-40"})
		})
	}
}

// A frame the broker relays and the client cannot parse: a field type
// amqp091-go does not know ('L', which RabbitMQ takes, and relays as it
// came from a classic queue; a quorum queue writes it again as 'l'), and a
// table of more entries than amqp091-go accepts. The second has no message
// id: its row is found by its payload hash.
func TestMalformedPropertiesAreDeadLetteredAloneWithARowAndTheQueueFlows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	classic := func(cfg *Config) { cfg.QueueType = "classic" }
	e.declare(classic)
	wide := amqp.Table{}
	for i := range 8193 {
		wide[fmt.Sprint(i)] = nil
	}
	poisons := []poison{
		{id: "unknown-type", body: `{"poison":"L"}`, headers: amqp.Table{}, rawL: true},
		{body: `{"poison":"wide"}`, headers: wide},
	}
	good := e.publishAmong(poisons...)
	c := e.newConsumer(e.effectHandler(), classic)
	start(t, c)
	waitFor(t, 30*time.Second, "the good messages applied and the poisons dead-lettered", func() bool {
		s := c.Stats()
		return s.Processed == int64(len(good)) && s.DeadLettered == 2
	})
	requireUndecodableAlone(t, e, c, good, poisons,
		[]string{"unknown-type", "sha256:" + idem.HashBytes([]byte(`{"poison":"wide"}`)).String()})
}
