package amqpnames

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// What the broker writes when it dead-letters a message: one table per
// queue and reason, the newest first.
func TestDeathsReadsTheBrokersEntriesNewestFirst(t *testing.T) {
	t.Parallel()
	at1, at2 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), time.Date(2026, 1, 2, 3, 9, 0, 0, time.UTC)
	h := amqp.Table{"x-death": []any{
		amqp.Table{"queue": "q", "reason": "delivery_limit", "time": at2, "count": int64(1), "exchange": ""},
		amqp.Table{"queue": "q.retry", "reason": "expired", "time": at1, "count": int64(4), "routing-keys": []any{"q.retry"}},
	}}
	require.Equal(t, []Death{{Queue: "q", Reason: "delivery_limit", Time: at2}, {Queue: "q.retry", Reason: "expired", Time: at1}}, Deaths(h))
	newest, ok := NewestDeath(h)
	require.True(t, ok)
	require.Equal(t, Death{Queue: "q", Reason: "delivery_limit", Time: at2}, newest)
}

// A publisher sets x-death to anything: what is not the broker's shape
// reads as nothing, field by field, and never panics.
func TestDeathsOfAForgedHeaderReadOnlyWhatHasTheBrokersShape(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		h      amqp.Table
		deaths []Death
		newest bool
	}{
		"no header":           {amqp.Table{}, nil, false},
		"nil headers":         {nil, nil, false},
		"not an array":        {amqp.Table{"x-death": "q"}, nil, false},
		"an empty array":      {amqp.Table{"x-death": []any{}}, nil, false},
		"another header case": {amqp.Table{"X-Death": []any{amqp.Table{"queue": "q"}}}, nil, false},
		"fields of the wrong type": {amqp.Table{"x-death": []any{amqp.Table{"queue": int64(1), "reason": []byte("expired"), "time": "now"}}},
			[]Death{{}}, true},
		"a newest entry that is no table": {amqp.Table{"x-death": []any{"forged", amqp.Table{"queue": "q.retry", "reason": "expired"}}},
			[]Death{{Queue: "q.retry", Reason: "expired"}}, false},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, c.deaths, Deaths(c.h))
			newest, ok := NewestDeath(c.h)
			require.Equal(t, c.newest, ok)
			if !ok {
				require.Zero(t, newest)
			}
		})
	}
}

func TestIsDeathHeaderNamesTheBrokersDeadLetteringHeaders(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"x-death", "X-Death", "x-first-death-reason", "x-first-death-queue", "x-last-death-exchange"} {
		require.True(t, IsDeathHeader(n), n)
	}
	for _, n := range []string{"x-deaths", "x-idem-reason", "x-delivery-count", "death", ""} {
		require.False(t, IsDeathHeader(n), n)
	}
}

// Deaths and NewestDeath read a header a publisher controls: whatever the
// entries hold, they agree with each other and never panic.
func FuzzDeaths(f *testing.F) {
	f.Add("q", "expired", int64(1700000000), uint8(0), uint8(0))
	f.Add("q.retry", "delivery_limit", int64(0), uint8(1), uint8(2))
	f.Fuzz(func(t *testing.T, queue, reason string, unix int64, firstKind, secondKind uint8) {
		entry := func(kind uint8) any {
			switch kind % 4 {
			case 0:
				return amqp.Table{"queue": queue, "reason": reason, "time": time.Unix(unix, 0)}
			case 1:
				return amqp.Table{"queue": []byte(queue), "reason": unix, "time": reason}
			case 2:
				return queue
			default:
				return nil
			}
		}
		h := amqp.Table{"x-death": []any{entry(firstKind), entry(secondKind)}}
		deaths := Deaths(h)
		newest, ok := NewestDeath(h)
		_, firstIsTable := h["x-death"].([]any)[0].(amqp.Table)
		require.Equal(t, firstIsTable, ok)
		if ok {
			require.Equal(t, deaths[0], newest)
		}
		for _, d := range deaths {
			if d.Queue != "" {
				require.Equal(t, queue, d.Queue)
			}
			if d.Reason != "" {
				require.Equal(t, reason, d.Reason)
			}
		}
	})
}
