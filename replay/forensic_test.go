package replay

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/streamio"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/replay")

// golden compares got with the golden file name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("..", "testdata", "replay", name)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./replay -run %s -update to create it", t.Name())
	require.Equal(t, string(want), string(got), "the report differs from %s (go test ./replay -update rewrites it)", path)
}

func TestForensicReplayWritesNothingAndReportsEachMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// The live consumer processed m-0 … m-3, and m-4 with another payload.
	c := e.consumer(nil, nil)
	var live []consumer.Message
	for i := 0; i < 4; i++ {
		m := msg(i)
		live = append(live, consumer.Message{MessageID: m.MessageID, Body: m.Body})
	}
	live = append(live, consumer.Message{MessageID: "m-4", Body: body(event{Key: "k4", N: 400})})
	outs, err := c.Process(ctx, live)
	require.NoError(t, err)
	for _, o := range outs {
		require.Equal(t, idem.Processed, o.Outcome)
	}
	e.publish(msgs(0, 6)...) // m-4 conflicts, m-5 is not processed
	e.publish(
		streamio.Outgoing{MessageID: "m-fail", Body: body(event{Key: "k1", Fail: true})},
		streamio.Outgoing{MessageID: "m-reject", Body: body(event{Key: "k1", Reject: true})},
		streamio.Outgoing{MessageID: "m-write", Body: body(event{Key: "k2", N: 9, Write: true})},
		streamio.Outgoing{Body: body(event{Key: "k3"})}, // no message id
		streamio.Outgoing{MessageID: "m-6", Body: []byte(`{"key": "k1", "n": `)},
	)
	before := e.snapshot()

	var report bytes.Buffer
	s, err := Run(ctx, c, Options{Mode: idem.Forensic, Report: &report})
	require.ErrorIs(t, err, ErrFindings)
	require.Equal(t, before, e.snapshot(), "a forensic replay changed a table")
	require.EqualValues(t, 11, s.Messages)
	require.EqualValues(t, 1, s.Conflicts)
	require.EqualValues(t, 4, s.InboxDuplicate)
	require.EqualValues(t, 5, s.InboxNew)
	require.EqualValues(t, 2, s.Retried, "fail, write")
	require.EqualValues(t, 3, s.DeadLettered, "reject, no id, undecodable")
	golden(t, "forensic.jsonl", report.Bytes())
}

func TestForensicReplayOfAHealthyStreamExitsZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 30)...)
	c := e.consumer(nil, nil)
	_, err := Run(context.Background(), c, Options{Mode: idem.Normal})
	require.NoError(t, err)
	var out bytes.Buffer
	s, err := Run(context.Background(), c, Options{Mode: idem.Forensic, From: Offset(5), Report: &out})
	require.NoError(t, err)
	require.False(t, s.Findings())
	require.Equal(t, 26, bytes.Count(out.Bytes(), []byte("\n")), "25 messages and the summary")
	require.Contains(t, out.String(), `"kind":"summary","end_offset":29,"first_offset":5,"last_offset":29,"messages":25,"inbox_new":0,"inbox_duplicate":25`)
}
