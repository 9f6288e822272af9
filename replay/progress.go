package replay

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// redraw is how often the progress bar is drawn on a terminal.
const redraw = 100 * time.Millisecond

// progress draws a replay's progress until stopped: a bar with rate and ETA
// on a terminal, a line every interval otherwise.
type progress struct {
	w       io.Writer
	tty     bool
	label   string
	from    int64 // first offset of the range; -1 until known
	end     int64
	settled *atomic.Int64
	first   *atomic.Int64
	last    *atomic.Int64
	start   time.Time
	quit    chan struct{}
	done    chan struct{}
}

// startProgress starts drawing to w; stop ends it with a last line.
func startProgress(w io.Writer, interval time.Duration, label string, from Position, end int64, settled, first, last *atomic.Int64) *progress {
	p := &progress{w: w, tty: isTerminal(w), label: label, from: -1, end: end,
		settled: settled, first: first, last: last, start: time.Now(),
		quit: make(chan struct{}), done: make(chan struct{})}
	if from.kind == posOffset {
		p.from = from.offset
	}
	if p.tty {
		interval = redraw
	}
	go func() { // owned: stop closes quit and waits for done
		defer close(p.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

// stop ends the drawing with a final line.
func (p *progress) stop() {
	close(p.quit)
	<-p.done
	p.draw(true)
}

func (p *progress) draw(final bool) {
	n, last := p.settled.Load(), p.last.Load()
	from := p.from
	if from < 0 {
		from = p.first.Load()
	}
	line := p.line(n, from, last, time.Since(p.start), final)
	if p.tty {
		end := ""
		if final {
			end = "\n"
		}
		fmt.Fprintf(p.w, "\r%s\x1b[K%s", line, end)
		return
	}
	fmt.Fprintln(p.w, line)
}

// line formats the progress of n messages settled up to offset last, of
// the offsets [from, p.end], after elapsed.
func (p *progress) line(n, from, last int64, elapsed time.Duration, final bool) string {
	rate := float64(n) / max(elapsed.Seconds(), 1e-9)
	frac := -1.0
	if from >= 0 && last >= from && p.end >= from {
		frac = float64(last-from+1) / float64(p.end-from+1)
	}
	eta := "?"
	switch {
	case final:
		eta = "done"
	case frac > 0:
		eta = formatDuration(time.Duration(float64(elapsed) * (1 - frac) / frac))
	}
	if !p.tty {
		pct := "?"
		if frac >= 0 {
			pct = fmt.Sprintf("%.0f%%", frac*100)
		}
		return fmt.Sprintf("replay %s: %s, %d messages, offset %d of %d, %.0f msg/s, eta %s",
			p.label, pct, n, last, p.end, rate, eta)
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
	return fmt.Sprintf("%s [%s] %s %d msgs  %.0f msg/s  ETA %s", p.label, bar, pct, n, rate, eta)
}

// formatDuration prints d as h:mm:ss or m:ss.
func formatDuration(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
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
