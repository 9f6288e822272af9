package main

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/inbox"
)

// checkRetention checks what the retention faults' doors did: each door
// was gone through at least once, and none let through what it had to
// refuse or refused what it had to let through. That nothing was applied
// twice is the examples' checks.
func (h *harness) checkRetention(rep *report) {
	if !h.cfg.has(faultRetention) {
		return
	}
	for _, c := range []struct {
		door doorKind
		what string
	}{
		{doorCleanup, fmt.Sprintf("idem inbox cleanup at the floor W=%s deleted only rows last seen before it, each one the soak saw go, "+
			"and recorded a horizon over every copy it forgot", h.floor)},
		{doorReplayBelow, "a normal replay of the stream from first was refused, naming the horizon, and replayed nothing"},
		{doorReplayAbove, "a normal replay from just above the horizon to the tail ran and processed nothing the live consumer had"},
		{doorRedrive, "redrive left in the dead-letter queue every message that entered it by the horizon, and moved only later ones"},
	} {
		var did, problems []string
		for _, inj := range rep.Injections {
			for _, d := range inj.Doors {
				if d.Door != c.door {
					continue
				}
				did = append(did, d.Target+": "+d.Did)
				for _, p := range d.Problems {
					problems = append(problems, d.Target+": "+p)
				}
			}
		}
		if len(did) == 0 {
			problems = append(problems, "no retention fault got to this door")
		}
		rep.check("retention", c.what, len(problems) == 0, summarize(problems, strings.Join(did, "; ")))
	}
}

// judgeCleanup lists what is wrong with a cleanup at the floor that
// reported deleted rows, deleted the rows gone and left the horizons hs:
// the count must be the rows the soak saw go, each last seen before
// seenBefore (the floor before the cleanup ended), and for each source the
// horizon must cover every forgotten copy, its newest sighting and its
// highest offset.
func judgeCleanup(deleted int, gone map[string]inboxRow, hs []horizon, seenBefore time.Time) []string {
	var bad []string
	if deleted != len(gone) {
		bad = append(bad, fmt.Sprintf("idem reported %d rows deleted, the soak saw %d go", deleted, len(gone)))
	}
	for _, id := range sortedKeys(gone, map[string]bool{}) {
		r := gone[id]
		if !r.lastSeen.Before(seenBefore) {
			bad = append(bad, fmt.Sprintf("%s was last seen at %s, within the floor", id, stamp(r.lastSeen)))
		}
		i := slices.IndexFunc(hs, func(hz horizon) bool { return hz.Source == r.source })
		switch {
		case i < 0:
			bad = append(bad, fmt.Sprintf("%s is forgotten, and %q has no horizon", id, r.source))
		case hs[i].SeenAt.Before(r.lastSeen):
			bad = append(bad, fmt.Sprintf("%s was last seen at %s, after the horizon's %s", id, stamp(r.lastSeen), stamp(hs[i].SeenAt)))
		case r.lastOffset != nil && (hs[i].Offset == nil || *hs[i].Offset < *r.lastOffset):
			bad = append(bad, fmt.Sprintf("%s was last seen at offset %d, above the horizon (%s)", id, *r.lastOffset, hs[i]))
		}
	}
	return bad
}

// judgeReplayBelow lists what is wrong with a normal replay from below the
// horizon (offsets up to off of stream forgotten) that printed out: it
// must exit 2 with an error naming the horizon, and replay nothing.
func judgeReplayBelow(out operated, off int64, stream string) []string {
	var bad []string
	if out.code != 2 {
		bad = append(bad, fmt.Sprintf("exit %d, not 2 (refused)", out.code))
	}
	if name := fmt.Sprintf("forgot offsets up to %d of %s", off, stream); !strings.Contains(out.stderr, inbox.ErrBeyondHorizon.Error()) ||
		!strings.Contains(out.stderr, name) {
		bad = append(bad, fmt.Sprintf("its error does not say %q (%v): %s", name, inbox.ErrBeyondHorizon, out.text()))
	}
	if s, ok := parseReplaySummary(out.stderr); ok {
		bad = append(bad, "it replayed: "+s.String())
	}
	return bad
}

// judgeReplayAbove lists what is wrong with a normal replay from just
// above the horizon (offset off) to the tail that printed out and summary
// s (ok false when there was none), the live consumer's checkpoint being at
// live when it started: it must succeed, start past the horizon, and
// process no message up to live — those the live consumer had processed,
// or (a conflict, a malformed one) dead-lettered.
func judgeReplayAbove(out operated, s replaySummary, ok bool, off, live int64) []string {
	var bad []string
	switch {
	case out.code != 0:
		bad = append(bad, fmt.Sprintf("exit %d, not 0: %s", out.code, firstLineWith(out.stderr, "replay")))
	case !ok:
		bad = append(bad, "no summary in its output: "+out.text())
	case s.messages > 0 && s.first <= off:
		bad = append(bad, fmt.Sprintf("it started at offset %d, at or below the horizon %d", s.first, off))
	case s.processed > max(0, s.last-live):
		bad = append(bad, fmt.Sprintf("it processed %d messages, but only %d came after the live consumer's checkpoint %d: it applied some a second time",
			s.processed, max(0, s.last-live), live))
	}
	return bad
}

// replaySummary is the part of a replay's printed summary the soak reads.
type replaySummary struct {
	messages, first, last               int64
	processed, duplicates, deadLettered int64
}

func (s replaySummary) String() string {
	if s.messages == 0 {
		return "no message"
	}
	return fmt.Sprintf("offsets %d to %d, %d messages: %d processed, %d duplicates, %d dead-lettered",
		s.first, s.last, s.messages, s.processed, s.duplicates, s.deadLettered)
}

// summaryLine matches the summary replaycmd.Main prints.
var summaryLine = regexp.MustCompile(`: (\d+) messages(?: \(offsets (\d+) to (\d+)\))? in \S+\n\s+processed (\d+), duplicates (\d+), dead-lettered (\d+),`)

// parseReplaySummary reads the summary replaycmd.Main printed in out; ok is
// false when there is none.
func parseReplaySummary(out string) (s replaySummary, ok bool) {
	m := summaryLine.FindStringSubmatch(out)
	if m == nil {
		return s, false
	}
	n := func(i int) int64 {
		v, err := strconv.ParseInt(m[i], 10, 64)
		if err != nil {
			return -1
		}
		return v
	}
	return replaySummary{messages: n(1), first: n(2), last: n(3), processed: n(4), duplicates: n(5), deadLettered: n(6)}, true
}

// newestSighting is the newest forgotten sighting among a consumer's
// horizons, on any source: what redrive compares the time a message entered
// the dead-letter queue with. forgot is false when there is none.
func newestSighting(hs []horizon) (newest time.Time, forgot bool) {
	for _, hz := range hs {
		if hz.SeenAt.After(newest) {
			newest = hz.SeenAt
		}
	}
	return newest, len(hs) > 0
}

// expectRefused counts the messages of a dead-letter queue (queued, in
// queue order) that a redrive must leave there, given the queue's
// dead_letters rows (in id order) and the consumer's newest forgotten
// sighting (forgot false when it forgot nothing). A message entered the
// queue when its row was written: the oldest row not yet redriven with its
// message id ("sha256:" and its hash for a message without one), payload
// hash and reason, as redrive finds it. It must stay when it
// entered no later than the newest forgotten sighting, or when it has no
// such row (when it entered cannot be told). A message redrive moves marks
// its row, so the next copy finds the next one.
func expectRefused(queued []deadLetter, rows []deadLetterRow, newest time.Time, forgot bool) int {
	marked := map[int64]bool{}
	n := 0
	for _, q := range queued {
		i := slices.IndexFunc(rows, func(r deadLetterRow) bool {
			return !r.redriven && !marked[r.row] && r.hash == q.hash && r.reason == q.reason &&
				(r.id == q.id || q.id == "" && r.id == "sha256:"+hex.EncodeToString(q.hash[:]))
		})
		switch {
		case i < 0:
			n++
		case forgot && !rows[i].at.After(newest):
			n++
		default:
			marked[rows[i].row] = true
		}
	}
	return n
}

// judgeRedrive lists what is wrong with a redrive that printed out and got,
// when it had to refuse want messages and marked the rows moved, the
// consumer's newest forgotten sighting being newest: it must refuse exactly
// those (and at least one, or the door was not tried), say why with exit 1
// when it refused any (else exit 0), and move nothing that entered by the
// horizon.
func judgeRedrive(out operated, got redriveResult, want int, moved []deadLetterRow, newest time.Time, forgot bool) []string {
	var bad []string
	if want == 0 {
		bad = append(bad, "the dead-letter queue held no message that entered it by the horizon: nothing to refuse")
	}
	if got.Refused != want {
		bad = append(bad, fmt.Sprintf("refused %d messages, %d had entered the dead-letter queue by the horizon", got.Refused, want))
	}
	switch {
	case got.Refused > 0 && (out.code != 1 || !strings.Contains(out.stderr, inbox.ErrBeyondHorizon.Error())):
		bad = append(bad, fmt.Sprintf("exit %d with %d refused, not 1 and %q: %s", out.code, got.Refused, inbox.ErrBeyondHorizon, out.text()))
	case got.Refused == 0 && out.code != 0:
		bad = append(bad, fmt.Sprintf("exit %d: %s", out.code, out.text()))
	}
	for _, r := range moved {
		if forgot && !r.at.After(newest) {
			bad = append(bad, fmt.Sprintf("moved %q (%s), which entered at %s, by the newest forgotten sighting %s",
				r.id, r.reason, stamp(r.at), stamp(newest)))
		}
	}
	return bad
}
