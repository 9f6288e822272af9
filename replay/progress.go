package replay

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

// redraw is how often the progress bar is drawn on a terminal.
const redraw = 100 * time.Millisecond

// The phases of an online rebuild, as the progress display names them.
const (
	phaseBuilding   = "building"
	phaseCatchingUp = "catching up"
	phaseSwapping   = "swapping"
	phaseSwapped    = "swapped"
)

// tally is what a running replay shares with its progress display.
type tally struct {
	settled atomic.Int64 // messages settled
	first   atomic.Int64 // first offset settled; -1 until one is
	last    atomic.Int64 // last offset settled; -1 until one is
	// end is the offset the replay reads up to: fixed, or, in an online
	// rebuild, the live consumer's checkpoint, which moves.
	end atomic.Int64
	// phase is an online rebuild's phase; nil for other replays.
	phase atomic.Pointer[string]
	// pause is how long the swap held the live worker.
	pause atomic.Int64
}

func newTally() *tally {
	t := &tally{}
	t.first.Store(-1)
	t.last.Store(-1)
	t.end.Store(-1)
	return t
}

// setPhase enters an online rebuild's phase.
func (t *tally) setPhase(p string) { t.phase.Store(&p) }

// snapshot is the state one progress line shows.
type snapshot struct {
	n, from, last, end int64
	phase              string
	pause              time.Duration
	elapsed            time.Duration
	// final is the last line's state: "done" when the replay reached its
	// end, "stopped" when it ended before (an error, a Ctrl-C); "" while
	// it runs.
	final string
}

// progress draws a replay's progress until stopped: a bar with rate and ETA
// on a terminal, a line every interval otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	label string
	from  int64 // first offset of the range; -1 until known
	t     *tally
	start time.Time
	quit  chan struct{}
	done  chan struct{}
}

// startProgress starts drawing t to w, with a first line at once (a replay
// may read for a while before it settles its first message); stop ends it
// with a last line.
func startProgress(w io.Writer, interval time.Duration, label string, from Position, t *tally) *progress {
	p := &progress{w: w, tty: isTerminal(w), label: label, from: -1, t: t, start: time.Now(),
		quit: make(chan struct{}), done: make(chan struct{})}
	if from.kind() == streamio.PositionOffset {
		p.from = from.at()
	}
	if p.tty {
		interval = redraw
	}
	go func() { // owned: stop closes quit and waits for done
		defer close(p.done)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		p.draw("")
		for {
			select {
			case <-p.quit:
				return
			case <-tk.C:
				p.draw("")
			}
		}
	}()
	return p
}

// stop ends the drawing with a final line: the replay is done when
// finished, stopped before its end otherwise.
func (p *progress) stop(finished bool) {
	close(p.quit)
	<-p.done
	final := "stopped"
	if finished {
		final = "done"
	}
	p.draw(final)
}

// draw writes one line; final is snapshot.final.
func (p *progress) draw(final string) {
	s := snapshot{n: p.t.settled.Load(), from: p.from, last: p.t.last.Load(), end: p.t.end.Load(),
		pause: time.Duration(p.t.pause.Load()), elapsed: time.Since(p.start), final: final}
	if s.from < 0 {
		s.from = p.t.first.Load()
	}
	if ph := p.t.phase.Load(); ph != nil {
		s.phase = *ph
	}
	line := p.line(s)
	if p.tty {
		end := ""
		if final != "" {
			end = "\n"
		}
		fmt.Fprintf(p.w, "\r%s\x1b[K%s", line, end)
		return
	}
	fmt.Fprintln(p.w, line)
}

// line formats s: a bar on a terminal, a log line otherwise.
func (p *progress) line(s snapshot) string {
	rate := float64(s.n) / max(s.elapsed.Seconds(), 1e-9)
	frac := -1.0
	if s.from >= 0 && s.last >= s.from && s.end >= s.from {
		frac = min(float64(s.last-s.from+1)/float64(s.end-s.from+1), 1)
	}
	eta := "?"
	switch {
	case s.final != "":
		eta = s.final
	case s.phase == phaseSwapped:
		eta = "done"
	case frac > 0:
		eta = formatDuration(time.Duration(float64(s.elapsed) * (1 - frac) / frac))
	}
	if !p.tty {
		pct := "?"
		if frac >= 0 {
			pct = fmt.Sprintf("%.0f%%", frac*100)
		}
		return fmt.Sprintf("replay %s: %s%s, %d messages, offset %d of %d%s, %.0f msg/s, eta %s",
			p.label, phaseText(s), pct, s.n, s.last, s.end, lagText(s), rate, eta)
	}
	const width = 30
	bar := strings.Repeat(" ", width)
	pct := "  ?%"
	if frac >= 0 {
		full := int(frac * width)
		bar = strings.Repeat("=", full) + strings.Repeat(" ", width-full)
		if full < width {
			bar = strings.Repeat("=", full) + ">" + strings.Repeat(" ", width-full-1)
		}
		pct = fmt.Sprintf("%3.0f%%", frac*100)
	}
	return fmt.Sprintf("%s [%s] %s %s%d msgs%s  %.0f msg/s  ETA %s", p.label, bar, pct, phaseText(s), s.n, lagText(s), rate, eta)
}

// phaseText names an online rebuild's phase, with the swap's pause once it
// is done; "" for other replays.
func phaseText(s snapshot) string {
	switch s.phase {
	case "":
		return ""
	case phaseSwapping:
		return "swapping (live worker paused), "
	case phaseSwapped:
		return fmt.Sprintf("swapped at offset %d (live worker paused %s), ", s.end, s.pause.Round(time.Millisecond))
	default:
		return s.phase + ", "
	}
}

// lagText is an online rebuild's lag behind the live consumer: messages it
// committed that the rebuild has not applied yet; "" for other replays.
func lagText(s snapshot) string {
	if s.phase == "" || s.phase == phaseSwapped {
		return ""
	}
	done := s.last
	if done < 0 {
		done = s.from - 1
	}
	return fmt.Sprintf(", lag %d behind the live consumer", max(s.end-done, 0))
}

// formatDuration prints d as h:mm:ss or m:ss.
func formatDuration(d time.Duration) string {
	sec := int64(d.Round(time.Second) / time.Second)
	if sec >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", sec/3600, sec/60%60, sec%60)
	}
	return fmt.Sprintf("%d:%02d", sec/60, sec%60)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
