package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/console"
)

// messages returns the message ids q holds, leaving them there.
func (f *fixture) messages(q string) []string {
	f.t.Helper()
	info, err := f.ch.QueueDeclarePassive(q, true, false, false, false, nil)
	require.NoError(f.t, err)
	var ids []string
	for range info.Messages {
		d, ok, err := f.ch.Get(q, false)
		require.NoError(f.t, err)
		require.True(f.t, ok)
		ids = append(ids, d.MessageId)
	}
	require.NoError(f.t, f.ch.Nack(0, true, true))
	return ids
}

// depth waits until q holds n messages.
func (f *fixture) depth(q string, n int) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		info, err := f.ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && info.Messages == n
	}, 15*time.Second, 20*time.Millisecond, "%s holds %d", q, n)
}

func TestRedrivingOneDeadLetterMovesItsCopyAndMarksItsRowAsTheOperator(t *testing.T) {
	t.Parallel()
	f := newFixture(t).withQueue()
	one := f.deadLetter("billing", "m-1", "max_attempts", nil)
	f.deadLetter("billing", "m-2", "max_attempts", nil)
	f.depth(f.queue+".dlq", 2)
	c := f.serve(console.Config{Operator: "carol"})
	code, body := c.get("/deadletters/" + strconv.FormatInt(one, 10))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Redrive")
	code, body = c.post("/deadletters/redrive", url.Values{"id": {strconv.FormatInt(one, 10)}, "reason": {"the bug is fixed"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "moved 1 of")
	require.Equal(t, "carol", f.redrivenBy(one))
	f.depth(f.queue, 1)
	f.depth(f.queue+".dlq", 1)
	require.Equal(t, []string{"m-1"}, f.messages(f.queue))
	require.Equal(t, []string{"m-2"}, f.messages(f.queue+".dlq"))

	code, body = c.post("/deadletters/redrive", url.Values{"id": {strconv.FormatInt(one, 10)}, "reason": {"again"}})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "already settled")
}

func TestARedriveBeyondTheHorizonIsShownRefusedWithWhyAndLeavesTheMessage(t *testing.T) {
	t.Parallel()
	f := newFixture(t).withQueue()
	one := f.deadLetter("billing", "m-1", "max_attempts", nil)
	// Retention made billing forget a message seen after the dead letter.
	_, err := f.pool.Exec(context.Background(), "INSERT INTO "+f.tables.Table("inbox_horizons")+
		" (consumer, source, forgotten_seen_at) VALUES ('billing', $1, now() + interval '1 minute')", f.queue)
	require.NoError(t, err)
	c := f.serve(console.Config{Operator: "carol"})
	_, body := c.get("/deadletters/" + strconv.FormatInt(one, 10))
	require.Contains(t, body, "A redrive would be refused")
	code, body := c.post("/deadletters/redrive", url.Values{"consumer": {"billing"}, "dlreason": {"max_attempts"},
		"source": {f.queue}, "reason": {"redrive the group"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "refused, left in "+f.queue+".dlq")
	require.Contains(t, body, "horizon")
	require.Empty(t, f.redrivenBy(one))
	require.Equal(t, []string{"m-1"}, f.messages(f.queue+".dlq"))
	f.depth(f.queue, 0)
}

func TestDiscardMarksTheRowWithWhoAndWhyAndDeletesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t).withQueue()
	one := f.deadLetter("billing", "m-1", "max_attempts", nil)
	c := f.serve(console.Config{Operator: "carol"})
	c.get("/deadletters")
	code, _ := c.post("/deadletters/discard", url.Values{"id": {strconv.FormatInt(one, 10)}})
	require.Equal(t, http.StatusBadRequest, code, "a reason is required")
	code, body := c.post("/deadletters/discard", url.Values{"id": {strconv.FormatInt(one, 10)}, "reason": {"a test order, never to be applied"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "discarded by carol: a test order, never to be applied", f.redrivenBy(one))
	require.Equal(t, []string{"m-1"}, f.messages(f.queue+".dlq"), "its copy stays in the dead-letter queue")

	_, body = c.get("/deadletters?all=1")
	require.Contains(t, body, "discarded")
	code, body = c.post("/deadletters/redrive", url.Values{"consumer": {"billing"}, "dlreason": {"max_attempts"},
		"source": {f.queue}, "reason": {"redrive the group"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "refused", "a group redrive leaves a discarded message in the dead-letter queue")
	f.depth(f.queue, 0)
	f.depth(f.queue+".dlq", 1)
}
