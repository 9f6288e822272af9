package consumer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
)

// The ids a JSON field spells follow the canonical rules of the hash: every
// spelling of one number is one id.
func TestIDFromJSONFieldSpellsEveryNumberOneWay(t *testing.T) {
	t.Parallel()
	id := IDFromJSONField("invoiceId")
	for _, n := range []string{"1000", "1000.0", "1e3", "1E3", "10e2", "1E+3", "10000e-1"} {
		got, err := id(&Message{Body: []byte(`{"invoiceId":` + n + `,"amount":5}`)})
		require.NoError(t, err, n)
		require.Equal(t, "1000", got, n)
	}
	got, err := id(&Message{Body: []byte(`{"invoiceId":"1000","amount":5}`)})
	require.NoError(t, err)
	require.Equal(t, "1000", got, "the string 1000 is the id 1000; its payload hashes differently, so it is a conflict")
	got, err = id(&Message{Body: []byte(`{"invoiceId":"1e3","amount":5}`)})
	require.NoError(t, err)
	require.Equal(t, "1e3", got, "a string keeps its content")
}

// An id that is not text is refused, never repaired into another id.
func TestIDExtractorsRefuseIDsThatAreNotText(t *testing.T) {
	t.Parallel()
	fromJSON := IDFromJSONField("invoiceId")
	for _, body := range []string{
		"{\"invoiceId\":\"a\xff\"}", "{\"invoiceId\":\"a\xfe\"}", `{"invoiceId":"a\ud800"}`, `{"invoiceId":"\udc00"}`,
		`{"invoiceId":"a\u0000"}`, `{"invoiceId":1e1234567890}`, `{"invoiceId":true}`, `{"invoiceId":[1]}`,
	} {
		id, err := fromJSON(&Message{Body: []byte(body)})
		require.ErrorIs(t, err, idem.ErrInvalidID, "%q", body)
		require.Empty(t, id)
	}
	fromHeader := IDFromHeader("x-request-id")
	for _, v := range []any{"a\xff", "\xed\xa0\x80", "a\x00", int64(1000), 1000.0, []byte("r-1")} {
		id, err := fromHeader(&Message{Headers: map[string]any{"x-request-id": v}})
		require.ErrorIs(t, err, idem.ErrInvalidID, "%#v", v)
		require.Empty(t, id)
	}
	for _, h := range []map[string]any{{}, {"x-request-id": nil}} {
		id, err := fromHeader(&Message{Headers: h})
		require.NoError(t, err)
		require.Empty(t, id, "no header is no id")
	}
}

// FuzzIDFromHeader checks that a header's id is its value exactly when the
// value is text, and a refusal (idem.ErrInvalidID) otherwise: an id is
// always valid UTF-8, never a repaired copy of the value.
func FuzzIDFromHeader(f *testing.F) {
	for _, s := range []string{"r-1", "a\xff", "\xed\xa0\x80", "a\x00", "", "é😀", "\ufffd"} {
		f.Add(s, false)
	}
	f.Add("r-1", true)
	id := IDFromHeader("x-request-id")
	f.Fuzz(func(t *testing.T, value string, asBytes bool) {
		var v any = value
		if asBytes {
			v = []byte(value)
		}
		got, err := id(&Message{Headers: map[string]any{"x-request-id": v}})
		text := utf8.ValidString(value) && !strings.Contains(value, "\x00")
		switch {
		case err != nil && !errors.Is(err, idem.ErrInvalidID):
			t.Fatalf("refusal %v does not match idem.ErrInvalidID", err)
		case err != nil && (got != "" || (text && !asBytes)):
			t.Fatalf("%#v refused (%v) with id %q", v, err, got)
		case err == nil && (asBytes || !text || got != value):
			t.Fatalf("%#v gave the id %q", v, got)
		}
	})
}

// Invariant 23: one deposit published with its number id spelled 1000,
// 1000.0, 1e3, 1E3 and 10e2, as re-serialising producers do, is applied
// once; the other spellings are duplicates of it.
func TestOneDepositWithItsNumberIDSpelledFiveWaysIsAppliedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	canonical := func(cfg *Config) { cfg.MessageID, cfg.Hash = IDFromJSONField("invoiceId"), HashCanonicalJSON }
	e.declare(canonical)
	bodies := []string{
		`{"invoiceId":1000,"amount":5}`, `{"invoiceId":1000.0,"amount":5}`, `{"amount":5,"invoiceId":1e3}`,
		`{"invoiceId":1E3, "amount":5}`, `{"amount":5,"invoiceId":10e2}`,
	}
	for _, b := range bodies {
		e.publish("", b, nil)
	}
	deposit := `INSERT INTO ` + e.eff.Table() + ` (message_id, note) VALUES ($1, $2)`
	h := JSON(func(ctx context.Context, tx pgx.Tx, m *Message, d struct{ Amount int64 }) error {
		_, err := tx.Exec(ctx, deposit, m.ID, strconv.FormatInt(d.Amount, 10))
		return err
	})
	c := e.newConsumer(h, canonical)
	start(t, c)
	waitFor(t, 30*time.Second, "every deposit settled", func() bool { return settled(c) == int64(len(bodies)) })
	require.Equal(t, map[string]int{"1000": 1}, e.effects(), "the deposit is applied once, under one id")
	require.Equal(t, 5, e.count(`SELECT sum(note::int)::int FROM `+e.eff.Table()), "the balance is one deposit of 5")
	s := c.Stats()
	require.EqualValues(t, 1, s.Processed)
	require.EqualValues(t, len(bodies)-1, s.Duplicates)
	require.Zero(t, s.DeadLettered)
}

// An id that is not text, wherever it comes from (a JSON field, with the
// raw or the canonical hash; a header; the message-id property), is
// dead-lettered with reason invalid_id and a row, never replaced by
// another id, never processed.
func TestIDsThatAreNotTextAreDeadLetteredAsInvalidID(t *testing.T) {
	t.Parallel()
	type msg struct {
		label, messageID, body string
		headers                amqp.Table
	}
	fromJSON := []msg{
		{label: "json-ff", body: "{\"invoiceId\":\"a\xff\",\"amount\":5}"},
		{label: "json-fe", body: "{\"invoiceId\":\"a\xfe\",\"amount\":5}"},
		{label: "json-surrogate", body: `{"invoiceId":"a\ud800","amount":5}`},
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		msgs []msg
	}{
		{"json-field-raw-hash", func(c *Config) { c.MessageID = IDFromJSONField("invoiceId") }, fromJSON},
		{"json-field-canonical-hash", func(c *Config) { c.MessageID, c.Hash = IDFromJSONField("invoiceId"), HashCanonicalJSON }, fromJSON},
		{"header", func(c *Config) { c.MessageID = IDFromHeader("x-request-id") }, []msg{
			{label: "header-ff", body: `{}`, headers: amqp.Table{"x-request-id": "r-\xff"}},
			{label: "header-fe", body: `{}`, headers: amqp.Table{"x-request-id": "r-\xfe"}},
		}},
		{"message-id", nil, []msg{{messageID: "m-\xff", body: `{}`}, {messageID: "m-\x00", body: `{}`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declare(tc.edit)
			for _, m := range tc.msgs {
				e.publish(m.label+m.messageID, m.body, m.headers)
			}
			e.publish("good", `{"invoiceId":"good","amount":5}`, amqp.Table{"x-request-id": "good"})
			c := e.newConsumer(e.effectHandler(), tc.edit)
			start(t, c)
			waitFor(t, 30*time.Second, "every message settled", func() bool { return settled(c) == int64(len(tc.msgs)+1) })

			require.Equal(t, map[string]int{"good": 1}, e.effects(), "only the message with a text id is processed")
			require.EqualValues(t, len(tc.msgs), c.Stats().DeadLettered)
			dlq := e.drain(e.queue + ".dlq")
			require.Len(t, dlq, len(tc.msgs))
			for _, d := range dlq {
				require.Equal(t, deadletters.ReasonInvalidID, d.Headers["x-idem-reason"], "%q", d.MessageId)
			}
			require.Equal(t, len(tc.msgs), e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+` WHERE reason = $1`,
				deadletters.ReasonInvalidID), "a dead-letter row per refused id")
		})
	}
}
