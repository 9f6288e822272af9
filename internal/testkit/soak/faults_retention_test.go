package main

import (
	"bytes"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
)

func TestRetentionFloorOutlastsTheLongestGapBetweenCopies(t *testing.T) {
	t.Parallel()
	g := generator{run: "t", ex: quickstart}
	for i := range 10 {
		g.emit(message{kind: kindValid, id: string(rune('a' + i)), body: []byte{byte(i)}})
	}
	g.emit(message{kind: kindDup, id: "b", of: 1, body: []byte{1}})          // 9 messages later
	g.emit(message{kind: kindRetry, id: "a-retry", of: 0, body: []byte{0}})  // another id: no copy
	g.emit(message{kind: kindConflict, id: "e", of: 4, body: []byte{4, 4}})  // 8 messages later
	g.emit(message{kind: kindCaptureConflict, id: "a-cc", of: 0, body: nil}) // another id
	p := plan{msgs: g.out}
	require.Equal(t, 3*time.Second, p.copyGap(3), "9 messages at 3 per second")
	require.Equal(t, 18*time.Second, retentionFloor(p, 3), "the gap and the slack, rounded up to the second")
	require.Equal(t, 20*time.Second, retentionFloor(p, 2), "4.5s + 15s, rounded up")

	for seed := range uint64(5) {
		cfg := testConfig(t, ciArgs...)
		cfg.seed = seed + 1
		p := newPlan(cfg, "t")
		floor := retentionFloor(p, cfg.rate)
		require.GreaterOrEqual(t, floor, p.copyGap(cfg.rate)+retentionSlack)
		require.LessOrEqual(t, floor, 25*time.Second, "seed %d: make soak cleans at about 20s", cfg.seed)
	}
}

func TestScheduleCleansOnlyOnceRowsOlderThanTheFloorExist(t *testing.T) {
	t.Parallel()
	// make soak's run, the fault alone, and a longer run where it comes up
	// again and again.
	for _, c := range []struct {
		args    []string
		atLeast int // cleanups over the eight seeds
	}{
		{ciArgs, 8},
		{[]string{"-faults", "retention"}, 8},
		{[]string{"-n", "6000", "-rate", "100", "-duration-cap", "3m", "-faults", "kill,retention"}, 12},
	} {
		args, cleanups := c.args, 0
		for seed := range uint64(8) {
			cfg := testConfig(t, args...)
			cfg.seed = seed + 1
			events, window, floor, err := scheduled(cfg)
			require.NoError(t, err, "%v seed %d", args, cfg.seed)
			last := time.Duration(-1)
			for i, e := range events {
				if i > 0 {
					require.GreaterOrEqual(t, e.at, events[i-1].at, "%v seed %d: out of order", args, cfg.seed)
				}
				if e.fault != faultRetention {
					continue
				}
				require.GreaterOrEqual(t, e.at, floor+retentionLead, "%v seed %d: a cleanup before rows older than the floor exist", args, cfg.seed)
				require.Less(t, e.at, window-3*time.Second, "%v seed %d", args, cfg.seed)
				if last >= 0 {
					require.GreaterOrEqual(t, e.at-last, floor, "%v seed %d: two cleanups within the floor", args, cfg.seed)
				}
				last = e.at
				cleanups++
			}
			require.GreaterOrEqual(t, last, time.Duration(0), "%v seed %d: no retention fault", args, cfg.seed)
		}
		require.GreaterOrEqual(t, cleanups, c.atLeast, "%v", args)
	}
}

func TestScheduleRefusesARunTooShortForTheRetentionFault(t *testing.T) {
	t.Parallel()
	_, _, _, err := scheduled(testConfig(t, "-n", "500", "-rate", "60", "-faults", "retention"))
	require.ErrorContains(t, err, "fault retention does not fit")
}

func TestRetentionFaultNeedsItsDoors(t *testing.T) {
	t.Parallel()
	_, err := parseFlags([]string{"-faults", "retention", "-examples", "quickstart,payments"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "needs the orders example")
	_, err = parseFlags([]string{"-faults", "retention", "-examples", "orders,liveness"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "quickstart or payments")
	testConfig(t, "-faults", "retention", "-examples", "orders,payments")
}

func TestPlanOpensTheQueuesWithADeadLetterForTheRedriveDoor(t *testing.T) {
	t.Parallel()
	first := func(cfg config) map[example]kind {
		out := map[example]kind{}
		for _, m := range newPlan(cfg, "t").msgs {
			if _, ok := out[m.ex]; !ok {
				out[m.ex] = m.kind
			}
		}
		return out
	}
	got := first(testConfig(t, "-malformed", "0", "-seed", "2"))
	require.Equal(t, kindMalformed, got[quickstart])
	require.Equal(t, kindMalformed, got[payments])
	require.Equal(t, kindValid, got[orders])
	require.Equal(t, kindValid, got[liveness])
	got = first(testConfig(t, "-malformed", "0", "-seed", "2", "-faults", "kill"))
	require.Equal(t, kindValid, got[quickstart], "only the retention fault adds it")
}

func TestDeletedRowsAreThoseGoneOrClaimedAnew(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0)
	before := map[string]inboxRow{"kept": {received: t0}, "gone": {received: t0}, "back": {received: t0}}
	after := map[string]inboxRow{"kept": {received: t0}, "back": {received: t0.Add(time.Second)}, "new": {received: t0}}
	gone := deletedRows(before, after)
	require.ElementsMatch(t, []string{"gone", "back"}, slices.Collect(maps.Keys(gone)))
}

func TestRecallFindsForgottenMessagesThatCameBack(t *testing.T) {
	t.Parallel()
	h1, h2 := hashOf([]byte("1")), hashOf([]byte("2"))
	db := &monitor{}
	db.forget(orders, map[string]inboxRow{"a": {hash: h1}, "b": {hash: h2}})
	require.True(t, db.forgotten(orders, "a"))
	require.False(t, db.forgotten(quickstart, "a"))

	held, n, back := db.merge(orders, map[string]inboxRow{"c": {hash: h1}})
	require.Equal(t, map[string][32]byte{"a": h1, "b": h2, "c": h1}, held, "what the inbox holds and held")
	require.Equal(t, 2, n)
	require.Empty(t, back)

	_, _, back = db.merge(orders, map[string]inboxRow{"b": {hash: h2, received: time.Unix(200, 0)}})
	require.Len(t, back, 1)
	require.Contains(t, back[0], "b: claimed as new")

	db.forget(orders, map[string]inboxRow{"a": {hash: h1}})
	_, _, back = db.merge(orders, nil)
	require.Len(t, back, 1)
	require.Contains(t, back[0], "a: its row was deleted twice")
}

func TestCleanupJudgedByWhatItDeletedAndTheHorizonItRecorded(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	off := func(o int64) *int64 { return &o }
	gone := map[string]inboxRow{
		"a": {source: "s", lastSeen: t0, lastOffset: off(10)},
		"b": {source: "s", lastSeen: t0.Add(time.Second), lastOffset: off(12)},
	}
	hs := []horizon{{Source: "s", Offset: off(12), SeenAt: t0.Add(time.Second)}}
	require.Empty(t, judgeCleanup(2, gone, hs, t0.Add(5*time.Second)))

	bad := judgeCleanup(3, gone, []horizon{{Source: "s", Offset: off(11), SeenAt: t0}}, t0.Add(time.Second))
	require.Len(t, bad, 3, "%q", bad)
	require.Contains(t, bad[0], "idem reported 3 rows deleted, the soak saw 2 go")
	require.Contains(t, bad[1], "within the floor")
	require.Contains(t, bad[2], "after the horizon's")

	bad = judgeCleanup(2, gone, []horizon{{Source: "s", Offset: off(11), SeenAt: t0.Add(time.Second)}}, t0.Add(5*time.Second))
	require.Equal(t, []string{"b was last seen at offset 12, above the horizon (offsets up to 11, last seen until 12:00:01.000)"}, bad)
	require.Len(t, judgeCleanup(2, gone, nil, t0.Add(5*time.Second)), 2, "no horizon at all")
}

// replayOutput is what replaycmd.Main prints on stderr for a normal replay
// (its progress logs aside).
const replayOutput = `time=2026-01-01T12:00:00Z level=INFO msg="replay started" from=114 end=479
replay normal of soak.x.orders (run 20260101-abc): 366 messages (offsets 114 to 479) in 1.2s
  processed 3, duplicates 358, dead-lettered 5, of which conflicts 0, skipped 0
`

func TestReplayDoorsJudgedByExitAndSummary(t *testing.T) {
	t.Parallel()
	s, ok := parseReplaySummary(replayOutput)
	require.True(t, ok)
	require.Equal(t, replaySummary{messages: 366, first: 114, last: 479, processed: 3, duplicates: 358, deadLettered: 5}, s)
	_, ok = parseReplaySummary("replay normal of s: 0 messages in 0s\n  processed 0, duplicates 0, dead-lettered 0, skipped 0")
	require.True(t, ok, "an empty range has no offsets")

	refused := operated{code: 2, stderr: "orders: replay: the range starts below the inbox horizon: " + inbox.ErrBeyondHorizon.Error() +
		`: consumer "orders-overview" forgot offsets up to 113 of soak.x.orders (retention, …); offset 0 could be applied again`}
	require.Empty(t, judgeReplayBelow(refused, 113, "soak.x.orders"))
	require.Len(t, judgeReplayBelow(refused, 120, "soak.x.orders"), 1, "another horizon")
	require.Len(t, judgeReplayBelow(operated{code: 0, stderr: replayOutput}, 113, "soak.x.orders"), 3, "not refused, replayed")

	ran := operated{stderr: replayOutput}
	require.Empty(t, judgeReplayAbove(ran, s, true, 113, 476), "3 processed past the live checkpoint 476")
	bad := judgeReplayAbove(ran, s, true, 113, 477)
	require.Len(t, bad, 1)
	require.Contains(t, bad[0], "it processed 3 messages, but only 2 came after the live consumer's checkpoint 477")
	require.Len(t, judgeReplayAbove(ran, s, true, 114, 476), 1, "started at the horizon")
	require.Len(t, judgeReplayAbove(operated{code: 2, stderr: "replay: boom"}, replaySummary{}, false, 113, 476), 1)
	require.Len(t, judgeReplayAbove(operated{}, replaySummary{}, false, 113, 476), 1, "no summary")
}

func TestRedriveMustRefuseWhatEnteredByTheHorizonAndMoveTheRest(t *testing.T) {
	t.Parallel()
	horizon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old, young := horizon.Add(-time.Second), horizon.Add(time.Second)
	h1, h2, h3, h4 := hashOf([]byte("1")), hashOf([]byte("2")), hashOf([]byte("3")), hashOf([]byte("4"))
	row := func(n int64, h [32]byte, reason string, at time.Time) deadLetterRow {
		return deadLetterRow{deadLetter: deadLetter{id: "m", hash: h, reason: reason}, row: n, at: at}
	}
	rows := []deadLetterRow{
		row(1, h1, "decode_error", old),
		row(2, h2, "payload_conflict", horizon), // entered at the horizon: refused
		row(3, h3, "payload_conflict", young),
		row(4, h3, "payload_conflict", young), // a second copy finds the next row
		row(5, h4, "decode_error", old),
	}
	rows[4].redriven = true // redriven before: h4 has no row to go by
	queued := []deadLetter{
		{id: "m", hash: h1, reason: "decode_error"},
		{id: "m", hash: h2, reason: "payload_conflict"},
		{id: "m", hash: h3, reason: "payload_conflict"},
		{id: "m", hash: h3, reason: "payload_conflict"},
		{id: "m", hash: h4, reason: "decode_error"},
		{id: "m", hash: h1, reason: "max_attempts"}, // no row with this reason
	}
	require.Equal(t, 4, expectRefused(queued, rows, horizon, true))
	require.Equal(t, 2, expectRefused(queued, rows, horizon, false), "nothing forgotten: only what has no row stays")
	require.Equal(t, 1, expectRefused(queued[2:4], []deadLetterRow{row(3, h3, "payload_conflict", young)}, horizon, true),
		"two copies, one row: the second copy finds none")
	require.Equal(t, 1, expectRefused([]deadLetter{{id: "other", hash: h3, reason: "payload_conflict"}}, rows, horizon, true),
		"another message with the same payload has no row of its own")
	noID := deadLetterRow{deadLetter: deadLetter{id: "sha256:" + hex.EncodeToString(h3[:]), hash: h3, reason: "missing_message_id"}, row: 6, at: young}
	require.Zero(t, expectRefused([]deadLetter{{hash: h3, reason: "missing_message_id"}}, []deadLetterRow{noID}, horizon, true),
		"a message without an id has the row of its hash")

	out := operated{code: 1, stderr: "idem deadletters: " + inbox.ErrBeyondHorizon.Error() + ": consumer \"quickstart\" forgot …"}
	require.Empty(t, judgeRedrive(out, redriveResult{Scanned: 6, Moved: 2, Refused: 4}, 4, []deadLetterRow{rows[2], rows[3]}, horizon, true))
	bad := judgeRedrive(operated{code: 0}, redriveResult{Scanned: 6, Moved: 3, Refused: 3}, 4, []deadLetterRow{rows[1]}, horizon, true)
	require.Len(t, bad, 3, "%q", bad)
	require.Contains(t, bad[0], "refused 3 messages, 4 had entered")
	require.Contains(t, bad[1], "exit 0 with 3 refused")
	require.Contains(t, bad[2], "moved \"m\" (payload_conflict), which entered at 12:00:00.000")
	require.Equal(t, []string{"the dead-letter queue held no message that entered it by the horizon: nothing to refuse"},
		judgeRedrive(operated{}, redriveResult{Scanned: 2, Moved: 2}, 0, nil, horizon, true))
}

func TestReportShowsWhatEachDoorDid(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, ciArgs...)
	rep := &report{Run: "r", Config: reportConfig(cfg),
		Examples: []exampleReport{{Example: "orders", Published: 10, Valid: 10, Forgotten: 4}},
		Injections: []injection{{Fault: faultRetention, Target: "all workers", At: 30 * time.Second, Recovery: time.Second,
			Outcome: "2 doors, 1 PROBLEMS", Doors: []door{
				{Door: doorCleanup, Target: "soak_r_orders", Did: "deleted 4 rows"},
				{Door: doorReplayBelow, Target: "soak.r.orders", Exit: 0, Did: "replayed", Problems: []string{"exit 0, not 2 (refused)"}},
			}}}}
	h := &harness{cfg: cfg, floor: 20 * time.Second}
	h.checkRetention(rep)
	rep.finish(cfg)
	require.False(t, rep.Pass)
	requirePrinted(t, rep,
		"| inbox rows deleted (retention fault) ",
		"    - cleanup soak_r_orders (exit 0): deleted 4 rows\n",
		"    - replay from first soak.r.orders (exit 0): replayed\n      PROBLEM: exit 0, not 2 (refused)\n",
		"| retention ")
	var failed []string
	for _, c := range rep.Checks {
		if !c.OK {
			failed = append(failed, c.What+": "+c.Detail)
		}
	}
	require.Len(t, failed, 3, "the replay door's problem, and the two doors no fault got to")
	require.True(t, strings.HasPrefix(failed[0], "a normal replay of the stream from first"), failed[0])
	require.Contains(t, failed[0], "exit 0, not 2")
}
