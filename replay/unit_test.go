package replay

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParsePositionReadsWhatStringWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 31, 12, 0, 0, 500, time.UTC)
	for in, want := range map[string]Position{
		"first": First(), "tail": Tail(), "0": Offset(0), "1200": Offset(1200),
		"2025-01-31T12:00:00.0000005Z": Time(at), "2025-01-31T13:00:00.0000005+01:00": Time(at),
	} {
		got, err := ParsePosition(in)
		require.NoError(t, err, in)
		require.Equal(t, want.String(), got.String(), in)
		again, err := ParsePosition(got.String())
		require.NoError(t, err)
		require.Equal(t, got.String(), again.String())
	}
	for _, in := range []string{"", "-1", "last", "12abc", "2025-01-31"} {
		_, err := ParsePosition(in)
		require.ErrorIs(t, err, ErrInvalidPosition, in)
	}
}

func TestProgressLineShowsRateAndETA(t *testing.T) {
	t.Parallel()
	p := &progress{label: "rebuild s", end: 199}
	line := p.line(50, 100, 149, 10*time.Second, false)
	require.Equal(t, "replay rebuild s: 50%, 50 messages, offset 149 of 199, 5 msg/s, eta 0:10", line)
	p.tty = true
	line = p.line(50, 100, 149, 10*time.Second, false)
	require.Equal(t, "rebuild s [===============>              ]  50% 50 msgs  5 msg/s  ETA 0:10", line)
	require.Contains(t, p.line(100, 100, 199, 20*time.Second, true), "[==============================] 100%")
	require.Contains(t, p.line(0, -1, -1, time.Second, false), "?%")
	require.Equal(t, "1:01:01", formatDuration(3661*time.Second))
}

func TestProgressWritesLinesWhenNotATerminal(t *testing.T) {
	t.Parallel()
	var settled, first, last atomic.Int64
	first.Store(-1)
	last.Store(-1)
	w := &lockedWriter{}
	p := startProgress(w, time.Millisecond, "normal s", First(), 9, &settled, &first, &last)
	settled.Store(10)
	first.Store(0)
	last.Store(9)
	p.stop()
	lines := strings.Split(strings.TrimSpace(w.String()), "\n")
	require.Equal(t, "replay normal s: 100%, 10 messages, offset 9 of 9", lines[len(lines)-1][:len("replay normal s: 100%, 10 messages, offset 9 of 9")])
	require.NotContains(t, w.String(), "\r", "no bar outside a terminal")
}

func TestMainRejectsBadArgumentsWithExitCode2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--mode", "forensic", "--from", "yesterday"},
		{"--mode", "forensic", "--to", "-3"},
		{"--mode", "normal", "extra"},
		{"--mode", "normal", "--report", "x.jsonl"},
		{"--no-such-flag"},
	} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), nil, args, Command{Stdout: &out, Stderr: &errOut})
		require.ErrorIs(t, err, ErrUsage, "%q", args)
		require.Equal(t, 2, ExitCode(err))
	}
	require.Equal(t, 0, ExitCode(nil))
	require.Equal(t, 0, ExitCode(flag.ErrHelp))
	require.Equal(t, 1, ExitCode(fmt.Errorf("run: %w", ErrFindings)))
	require.Equal(t, 2, ExitCode(errors.New("database down")))
}
