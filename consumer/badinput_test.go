package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

type jsonDeposit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func TestBadInputIsDeadLetteredWithAReasonAndTheQueueGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := JSON(func(ctx context.Context, tx pgx.Tx, m *Message, d jsonDeposit) error {
		return e.effectHandler()(ctx, tx, m)
	})
	manyHeaders := amqp.Table{}
	for i := 0; i < 300; i++ {
		manyHeaders[fmt.Sprintf("h%d", i)] = "x"
	}
	nested := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	cases := []struct {
		id, body string
		headers  amqp.Table
		reason   string // "" = processed
	}{
		{"invalid-json", `{"account": "A1", "amount": `, nil, deadletters.ReasonDecodeError},
		{"invalid-utf8", "{\"account\": \"\xff\xfe\", \"amount\": 1}", nil, ""}, // encoding/json replaces invalid UTF-8
		{"deeply-nested", nested, nil, deadletters.ReasonDecodeError},
		{"huge-body", `{"account":"A1","amount":1,"pad":"` + strings.Repeat("x", 64<<10) + `"}`, nil, deadletters.ReasonTooLarge},
		{"", `{"account":"A1","amount":1}`, nil, deadletters.ReasonMissingMessageID},
		{strings.Repeat("i", 250), `{"account":"A1","amount":1}`, nil, deadletters.ReasonInvalidMessageID},
		{"bad-\xff-id", `{"account":"A1","amount":1}`, nil, deadletters.ReasonInvalidID},
		{"nul-\x00-id", `{"account":"A1","amount":1}`, nil, deadletters.ReasonInvalidID},
		{"many-headers", `{"account":"A1","amount":1}`, manyHeaders, deadletters.ReasonTooManyHeaders},
		{"delivery-count-string", `{"account":"A1","amount":1}`, amqp.Table{"x-delivery-count": "seven"}, ""},
		{"attempt-string", `{"account":"A1","amount":1}`, amqp.Table{"x-idem-attempt": "1000000"}, ""},
		{"attempt-negative", `{"account":"A1","amount":1}`, amqp.Table{"x-idem-attempt": int64(-5)}, ""},
		{"good", `{"account":"A1","amount":1}`, nil, ""},
	}
	for _, tc := range cases {
		e.publish(tc.id, tc.body, tc.headers)
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.MaxMessageBytes = 32 << 10; cfg.MaxIDBytes = 200 })
	start(t, c)
	waitFor(t, 30*time.Second, "every message settled", func() bool { return settled(c) == int64(len(cases)) })

	dlq := map[string]string{}
	for _, d := range e.drain(e.queue + ".dlq") {
		dlq[d.MessageId] = d.Headers["x-idem-reason"].(string)
	}
	eff := e.effects()
	for _, tc := range cases {
		if tc.reason == "" {
			require.Equal(t, 1, eff[tc.id], "%q must be processed once", tc.id)
			continue
		}
		require.Equal(t, tc.reason, dlq[tc.id], "%q must be dead-lettered with %s", tc.id, tc.reason)
	}
	require.EqualValues(t, len(cases)-len(eff), c.Stats().DeadLettered)
}

// fuzzConsumer builds a consumer for pure preparation: the pool never connects.
func fuzzConsumer(tb testing.TB) *Consumer {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	c, err := New(Config{Name: "fuzz", Pool: pool, MaxMessageBytes: 1 << 16, MaxIDBytes: 64, MaxHeaders: 8,
		BusinessKey: func(m *Message) (string, error) { s, _ := m.Headers["key"].(string); return s, nil }})
	require.NoError(tb, err)
	return c
}

// FuzzPrepare feeds arbitrary ids, bodies and headers to the preparation
// every delivery goes through: it must never panic, and it must either mark
// the message for a dead letter with a reason or give it an id the inbox
// accepts.
func FuzzPrepare(f *testing.F) {
	f.Add("m-1", []byte(`{"account":"A1","amount":5}`), "k", int64(3), "x")
	f.Add("", []byte(`{}`), "", int64(-1), "")
	f.Add("\xff\xfe", []byte("\x00\x01"), "\x00", int64(1<<40), "many")
	f.Add(strings.Repeat("a", 65), []byte(strings.Repeat("[", 1000)), "key", int64(0), "seven")
	c := fuzzConsumer(f)
	f.Fuzz(func(t *testing.T, id string, body []byte, key string, attempt int64, count string) {
		headers := amqp.Table{"key": key, "x-idem-attempt": attempt, "x-delivery-count": count}
		it := c.eng.PrepareAll([]Message{{MessageID: id, Body: body, Headers: headers}})[0]
		m := it.Message
		require.Equal(t, idem.HashBytes(body), m.Hash)
		require.GreaterOrEqual(t, m.Attempt, 1)
		if it.Reject != nil {
			require.NotEmpty(t, it.Reject.Reason)
			require.True(t, utf8.ValidString(it.ID), "a dead letter's id is storable text")
			return
		}
		require.NotEmpty(t, m.ID)
		require.LessOrEqual(t, len(m.ID), 64)
		require.True(t, utf8.ValidString(m.ID))
		require.NotContains(t, m.ID, "\x00")
		require.LessOrEqual(t, len(m.BusinessKey), 64)
		require.True(t, utf8.ValidString(m.BusinessKey))
	})
}

// A 10 MB header table cannot even enter the queue: the broker refuses the
// frame and closes the publisher's connection. The consumer never sees it
// and goes on with the next message.
func TestTenMegabyteHeaderTableNeverReachesTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	c := e.newConsumer(e.effectHandler(), nil)
	start(t, c)

	huge := amqp.Table{}
	for i := 0; i < 10; i++ {
		huge[fmt.Sprintf("h%d", i)] = strings.Repeat("x", 1<<20)
	}
	pub := testbroker.Dial(t)
	ch, err := pub.Channel()
	require.NoError(t, err)
	err = ch.PublishWithContext(context.Background(), "", e.queue, false, false,
		amqp.Publishing{MessageId: "huge-headers", Body: []byte(`{}`), Headers: huge})
	if err == nil {
		// The client wrote the frame; the broker answers by closing the connection.
		select {
		case <-pub.NotifyClose(make(chan *amqp.Error, 1)):
		case <-time.After(10 * time.Second):
			t.Fatal("the broker accepted a 10 MB header table")
		}
	}
	e.publish("after", `{}`, nil)
	waitFor(t, 20*time.Second, "the next message processed", func() bool { return c.Stats().Processed == 1 })
	require.Equal(t, map[string]int{"after": 1}, e.effects())
	q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages)
}
