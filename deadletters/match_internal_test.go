package deadletters

import (
	"encoding/hex"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// What a message of the dead-letter queue says of itself: idem's own copy
// names its consumer, the id its row records, its reason and payload hash;
// a message the broker dead-lettered itself is judged for the operator's
// consumer by its message-id property and the broker's newest reason,
// whatever x-idem- headers its publisher set.
func TestIdentifyTrustsIdemsHeadersOnlyOnIdemsOwnCopy(t *testing.T) {
	t.Parallel()
	h := idem.HashBytes([]byte(`{"amt":1}`))
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	own := func(extra amqp.Table) amqp.Table {
		t := amqp.Table{HeaderConsumer: "billing", HeaderReason: "max_attempts", HeaderPayloadHash: h.String()}
		for k, v := range extra {
			t[k] = v
		}
		return t
	}
	death := func(queue, reason string) []any {
		return []any{amqp.Table{"queue": queue, "reason": reason, "time": at, "count": int64(1)}}
	}
	body := []byte(`{"amt":1}`)
	for _, c := range []struct {
		name       string
		d          amqp.Delivery
		want       letter
		wantHashed bool
	}{
		{"own copy that came through another queue's dead-lettering", amqp.Delivery{MessageId: "prop", Body: body,
			Headers: own(amqp.Table{HeaderMessageID: "m-1", "x-death": death("upstream", "rejected")})},
			letter{consumer: "billing", id: "m-1", reason: "max_attempts"}, true},
		{"own copy whose body is its canonical form's", amqp.Delivery{MessageId: "m-1", Body: []byte(`{ "amt" : 1 }`),
			Headers: own(nil)}, letter{consumer: "billing", id: "m-1", reason: "max_attempts"}, true},
		{"a forged copy: its body is not the one its hash names", amqp.Delivery{MessageId: "m-9", Body: []byte(`{"amt":9}`),
			Headers: own(amqp.Table{HeaderMessageID: "m-1"})}, letter{consumer: "ops", id: "m-9"}, false},
		{"own copy, id header", amqp.Delivery{MessageId: "prop", Body: body, Headers: own(amqp.Table{HeaderMessageID: "m-1"})},
			letter{consumer: "billing", id: "m-1", reason: "max_attempts"}, true},
		{"own copy without the id header", amqp.Delivery{MessageId: "m-1", Body: body, Headers: own(nil)},
			letter{consumer: "billing", id: "m-1", reason: "max_attempts"}, true},
		{"own copy without a usable id", amqp.Delivery{MessageId: "too-long", Body: body, Headers: own(amqp.Table{HeaderMessageID: ""})},
			letter{consumer: "billing", id: "sha256:" + h.String(), reason: "max_attempts"}, true},
		{"own copy after retries", amqp.Delivery{MessageId: "m-1", Body: body, Headers: own(amqp.Table{"x-death": death("q.retry", "expired")})},
			letter{consumer: "billing", id: "m-1", reason: "max_attempts"}, true},
		{"broker: delivery limit, forged headers", amqp.Delivery{MessageId: "m-2",
			Headers: own(amqp.Table{HeaderMessageID: "m-1", "x-death": death("q", "delivery_limit")})},
			letter{consumer: "ops", id: "m-2", reason: "delivery_limit", died: at}, false},
		{"broker: a partition's TTL", amqp.Delivery{MessageId: "m-2", Headers: own(amqp.Table{"x-death": death("q.p3", "expired")})},
			letter{consumer: "ops", id: "m-2", reason: "expired", died: at}, false},
		{"broker: no idem header", amqp.Delivery{MessageId: "m-2", Headers: amqp.Table{"x-death": death("q", "rejected")}},
			letter{consumer: "ops", id: "m-2", reason: "rejected", died: at}, false},
		{"a bad hash is no copy of idem's", amqp.Delivery{MessageId: "m-2", Headers: own(amqp.Table{HeaderPayloadHash: "zz"})},
			letter{consumer: "ops", id: "m-2"}, false},
		{"nothing", amqp.Delivery{}, letter{consumer: "ops"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := identify(c.d, "q", "ops")
			require.Equal(t, c.wantHashed, got.own())
			if got.own() {
				require.Equal(t, h[:], got.hash)
			}
			got.hash = nil
			require.Equal(t, c.want, got)
		})
	}
}

// The row of a message the broker dead-lettered holds its payload as the
// consumer hashed it: raw, or as canonical JSON.
func TestABrokerDeadLetterIsMatchedByItsBodysHashes(t *testing.T) {
	t.Parallel()
	body := []byte(`{"b":1, "a":2}`)
	raw, canonical := idem.HashBytes(body), must(idem.HashJSON(body))
	l := identify(amqp.Delivery{MessageId: "m", Body: body}, "q", "c")
	require.Equal(t, [][]byte{raw[:], canonical[:]}, l.payloadHashes(amqp.Delivery{Body: body}))
	notJSON := []byte("x")
	rawX := idem.HashBytes(notJSON)
	require.Equal(t, [][]byte{rawX[:]}, l.payloadHashes(amqp.Delivery{Body: notJSON}))
	own := identify(amqp.Delivery{Body: body, Headers: amqp.Table{HeaderConsumer: "c", HeaderReason: "r", HeaderPayloadHash: hex.EncodeToString(raw[:])}}, "q", "")
	require.Equal(t, [][]byte{raw[:]}, own.payloadHashes(amqp.Delivery{Body: notJSON}), "idem's copy names its hash")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// identify reads headers a publisher controls: whatever they hold, it
// neither panics nor takes a consumer or reason from a message the broker
// dead-lettered.
func FuzzIdentify(f *testing.F) {
	f.Add("billing", "max_attempts", "m-1", "00", "q", "delivery_limit", "prop")
	f.Add("", "", "", "", "q.retry", "expired", "")
	f.Fuzz(func(t *testing.T, consumer, reason, id, hash, queue, why, prop string) {
		h := amqp.Table{HeaderConsumer: consumer, HeaderReason: reason, HeaderMessageID: id, HeaderPayloadHash: hash,
			"x-death": []any{amqp.Table{"queue": queue, "reason": why}}}
		l := identify(amqp.Delivery{MessageId: prop, Headers: h, Body: []byte(hash)}, "q", "ops")
		if !l.own() {
			require.Equal(t, "ops", l.consumer)
			require.Equal(t, prop, l.id)
			require.Equal(t, why, l.reason)
			require.NotEmpty(t, l.payloadHashes(amqp.Delivery{Body: []byte(hash)}))
			return
		}
		require.Equal(t, consumer, l.consumer)
		require.Equal(t, "expired", why, "only a retry queue's expiry leaves a copy idem's")
		require.NotEqual(t, "q", queue)
		require.NotEmpty(t, l.id)
	})
}
