package replay

import (
	"strings"
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
	for _, in := range []string{"", "-1", "last", "12abc", "2025-01-31",
		"9999-12-31T23:30:00-01:00", "0000-01-01T00:30:00+01:00"} { // no UTC spelling that reads back
		_, err := ParsePosition(in)
		require.ErrorIs(t, err, ErrInvalidPosition, in)
	}
}

func TestProgressLineShowsRateAndETA(t *testing.T) {
	t.Parallel()
	p := &progress{label: "rebuild s"}
	at := snapshot{n: 50, from: 100, last: 149, end: 199, elapsed: 10 * time.Second}
	require.Equal(t, "replay rebuild s: 50%, 50 messages, offset 149 of 199, 5 msg/s, eta 0:10", p.line(at))
	p.tty = true
	require.Equal(t, "rebuild s [===============>              ]  50% 50 msgs  5 msg/s  ETA 0:10", p.line(at))
	require.Contains(t, p.line(snapshot{n: 100, from: 100, last: 199, end: 199, elapsed: 20 * time.Second, final: "done"}),
		"[==============================] 100%")
	require.Contains(t, p.line(snapshot{from: -1, last: -1, end: -1, elapsed: time.Second}), "?%")
	require.Equal(t, "1:01:01", formatDuration(3661*time.Second))
}

func TestOnlineRebuildProgressShowsItsLagBehindTheLiveConsumerAndTheSwap(t *testing.T) {
	t.Parallel()
	p := &progress{label: "rebuild s"}
	at := snapshot{n: 900, from: 0, last: 899, end: 999, elapsed: 9 * time.Second, phase: phaseCatchingUp}
	require.Equal(t, "replay rebuild s: catching up, 90%, 900 messages, offset 899 of 999, lag 100 behind the live consumer, "+
		"100 msg/s, eta 0:01", p.line(at))
	at.phase = phaseSwapping
	require.Contains(t, p.line(at), "swapping (live worker paused), 90%")
	at = snapshot{n: 1000, from: 0, last: 999, end: 999, elapsed: 10 * time.Second, phase: phaseSwapped,
		pause: 42 * time.Millisecond, final: "done"}
	require.Equal(t, "replay rebuild s: swapped at offset 999 (live worker paused 42ms), 100%, 1000 messages, offset 999 of 999, "+
		"100 msg/s, eta done", p.line(at))
	resumed := snapshot{from: 500, last: -1, end: 999, elapsed: time.Second, phase: phaseBuilding}
	require.Contains(t, p.line(resumed), "lag 500 behind the live consumer", "a resumed run that has not settled a message yet")
}

func TestProgressWritesLinesWhenNotATerminal(t *testing.T) {
	t.Parallel()
	tl := newTally()
	tl.end.Store(9)
	w := &lockedWriter{}
	p := startProgress(w, time.Millisecond, "normal s", First(), tl)
	tl.settled.Store(10)
	tl.first.Store(0)
	tl.last.Store(9)
	p.stop(true)
	lines := strings.Split(strings.TrimSpace(w.String()), "\n")
	require.Equal(t, "replay normal s: 100%, 10 messages, offset 9 of 9", lines[len(lines)-1][:len("replay normal s: 100%, 10 messages, offset 9 of 9")])
	require.NotContains(t, w.String(), "\r", "no bar outside a terminal")
	require.True(t, strings.HasSuffix(lines[len(lines)-1], "eta done"), lines[len(lines)-1])
}

func TestProgressSaysAtOnceThatAReplayStartedAndWhenOneStoppedBeforeItsEnd(t *testing.T) {
	t.Parallel()
	tl := newTally()
	tl.end.Store(99)
	w := &lockedWriter{}
	p := startProgress(w, time.Hour, "rebuild s", First(), tl)
	require.Eventually(t, func() bool { return strings.Contains(w.String(), "replay rebuild s:") }, 5*time.Second, time.Millisecond,
		"a first line before the first interval")
	tl.settled.Store(40)
	tl.first.Store(0)
	tl.last.Store(39)
	p.stop(false) // a Ctrl-C at offset 39 of 99
	lines := strings.Split(strings.TrimSpace(w.String()), "\n")
	require.Len(t, lines, 2)
	require.True(t, strings.HasSuffix(lines[1], "eta stopped"), lines[1])
}
