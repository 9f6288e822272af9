package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ciArgs is the small configuration CI runs: about 2,000 messages, every
// fault at least once, in under two minutes.
var ciArgs = []string{"-n", "2000", "-rate", "60", "-fault-every", "4s", "-duration-cap", "2m", "-seed", "1"}

func TestSoakSmall(t *testing.T) {
	if os.Getenv("IDEM_SOAK") != "1" {
		t.Skip("the soak runs the examples as processes for about two minutes; CI runs it as its own step " +
			"(IDEM_SOAK=1 go test -run TestSoakSmall ./internal/soak, or go run ./internal/soak)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	code := run(ctx, ciArgs, &out, &out)
	t.Log(out.String())
	require.Equal(t, exitPass, code, "the soak found an invariant violation or could not run")
}

func testConfig(t *testing.T, args ...string) config {
	t.Helper()
	cfg, err := parseFlags(args, &bytes.Buffer{})
	require.NoError(t, err)
	return cfg
}

// scheduled is the fault schedule of cfg's load, as a run computes it, and
// checkSchedule's verdict on it.
func scheduled(cfg config) (events []event, window, floor time.Duration, err error) {
	p := newPlan(cfg, "t")
	window, floor = p.estimate(cfg.rate), retentionFloor(p, cfg.rate)
	events = schedule(cfg, window, floor)
	return events, window, floor, checkSchedule(cfg, window, floor, events)
}

// requirePrinted prints rep and requires each of want in the printout,
// which it returns.
func requirePrinted(t *testing.T, rep *report, want ...string) string {
	t.Helper()
	var out bytes.Buffer
	rep.print(&out)
	s := out.String()
	for _, w := range want {
		require.Contains(t, s, w)
	}
	return s
}

func TestScheduleInjectsEveryFaultBeforeLeasesCouldOutliveTheCap(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		cfg := testConfig(t, ciArgs...)
		cfg.seed = seed + 1
		events, window, _, err := scheduled(cfg)
		require.NoError(t, err, "seed %d", cfg.seed)
		limit := min(window/2, cfg.durationCap-dispatcherLease-30*time.Second)
		for _, e := range events {
			require.Less(t, e.at, window, "seed %d: a fault after publishing", cfg.seed)
			if e.fault == faultDispatcher || e.fault == faultKill && e.target != quickstart && e.target != liveness {
				require.LessOrEqual(t, e.at, limit, "seed %d: %s of %s at %s could hold a lease past the cap", cfg.seed, e.fault, e.target, e.at)
			}
		}
	}
}

func TestScheduleNeverRunsTwoCompetePeriodsAtOnce(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		// Long runs with frequent faults: compete comes up again and again.
		cfg := testConfig(t, "-fault-every", "2s", "-duration-cap", "5m")
		cfg.seed = seed + 1
		window, floor := 4*time.Minute, 20*time.Second
		events := schedule(cfg, window, floor)
		require.NoError(t, checkSchedule(cfg, window, floor, events), "seed %d", cfg.seed)
		last, competes := time.Duration(-1), 0
		for _, e := range events {
			if e.fault != faultCompete {
				continue
			}
			competes++
			if last >= 0 {
				require.GreaterOrEqual(t, e.at-last, competeFor, "seed %d: compete at %s while the one at %s still runs", cfg.seed, e.at, last)
			}
			last = e.at
		}
		require.Positive(t, competes, "seed %d", cfg.seed)
	}
}

func TestScheduleRefusesARunTooShortForTheDispatcherFault(t *testing.T) {
	t.Parallel()
	_, _, _, err := scheduled(testConfig(t, "-n", "2000", "-rate", "60", "-duration-cap", "80s"))
	require.Error(t, err)
}

func TestPlanSendsEveryCopyAfterItsOriginal(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "-n", "3000", "-dup", "0.3", "-conflict", "0.05", "-malformed", "0.05", "-seed", "3")
	p := newPlan(cfg, "t")
	valid := map[example]int{}
	kinds := map[kind]int{}
	for i, m := range p.msgs {
		kinds[m.kind]++
		switch m.kind {
		case kindValid:
			valid[m.ex]++
			require.NotEmpty(t, m.id)
		case kindMalformed:
			require.NotEmpty(t, m.reason)
		default:
			require.Less(t, m.of, i, "a copy before its original")
			orig := p.msgs[m.of]
			require.Equal(t, kindValid, orig.kind)
			require.Equal(t, orig.ex, m.ex)
			require.Equal(t, orig.key, m.key)
			require.False(t, orig.probe, "an original with copies is no recovery probe")
			if m.kind == kindDup {
				require.Equal(t, orig.id, m.id)
				require.Equal(t, orig.body, m.body)
			}
			if m.kind == kindConflict {
				require.Equal(t, orig.id, m.id)
				require.NotEqual(t, orig.hash, m.hash)
			}
		}
	}
	require.Equal(t, map[example]int{quickstart: 750, payments: 750, orders: 750, liveness: 750}, valid)
	for _, k := range []kind{kindDup, kindRetry, kindConflict, kindCaptureConflict, kindMalformed} {
		require.Positive(t, kinds[k], "kind %d never generated", k)
	}
}

func TestLivenessDuplicatesComeRightAfterTheirOriginal(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "-n", "2000", "-dup", "0.3", "-seed", "5")
	p := newPlan(cfg, "t")
	var queue []int // the liveness queue's messages, in publishing order
	accounts := map[string]bool{}
	for i, m := range p.msgs {
		if m.ex != liveness {
			continue
		}
		if m.kind == kindDup {
			require.NotEmpty(t, queue)
			require.Equal(t, m.of, queue[len(queue)-1], "a liveness duplicate not next to its original")
		}
		if m.kind == kindValid {
			accounts[m.key] = true
		}
		queue = append(queue, i)
	}
	require.Len(t, accounts, hotAccounts, "every hot account gets deposits")
}

func TestExpectationFollowsTheInboxForConflictingCopies(t *testing.T) {
	t.Parallel()
	g := generator{cfg: config{}, run: "t", ex: quickstart}
	a := message{kind: kindValid, id: "m1", key: "A1", body: []byte(`{"account":"A1","amount":5}`)}
	g.emit(a)
	c := message{kind: kindConflict, id: "m1", key: "A1", body: []byte(`{"account":"A1","amount":1005}`)}
	g.emit(c)
	g.emit(message{kind: kindValid, id: "m2", key: "A2", body: []byte(`{"account":"A2","amount":7}`)})
	g.emit(message{kind: kindMalformed, id: "bad", reason: "decode_error", body: []byte(`{`)})
	p := plan{msgs: g.out}

	// The conflicting copy arrived first: it is the one applied, the
	// original is the payload conflict.
	e := expect(p, quickstart, map[string][32]byte{"m1": p.msgs[1].hash, "m2": p.msgs[2].hash}, nil)
	require.Empty(t, e.problems)
	require.Equal(t, map[string]int64{"A1": 1005, "A2": 7}, e.balances(p))
	require.ElementsMatch(t, []deadLetter{
		{id: "m1", hash: p.msgs[0].hash, reason: "payload_conflict"},
		{id: "bad", hash: p.msgs[3].hash, reason: "decode_error"},
	}, e.dead)

	// A message never processed, and one processed that must not be.
	e = expect(p, quickstart, map[string][32]byte{"m1": p.msgs[0].hash, "bad": p.msgs[3].hash}, nil)
	require.Len(t, e.problems, 2)
}

func TestOverviewKeepsTheNewestVersionWhateverTheOrder(t *testing.T) {
	t.Parallel()
	g := generator{run: "t", ex: orders}
	at := []time.Time{}
	for i, body := range []string{
		`{"orderId":"o-1","version":1,"type":"OrderPlaced"}`,
		`{"orderId":"o-1","version":3,"type":"OrderShipped"}`, // a gap
		`{"orderId":"o-1","version":2,"type":"OrderPaid"}`,    // then stale
		`{"orderId":"o-2","version":1,"type":"OrderPlaced"}`,
	} {
		g.emit(message{kind: kindValid, id: string(rune('a' + i)), body: []byte(body)})
		at = append(at, time.Unix(int64(i), 0))
	}
	p := plan{msgs: g.out}
	inbox := map[string][32]byte{}
	for _, m := range p.msgs {
		inbox[m.id] = m.hash
	}
	e := expect(p, orders, inbox, nil)
	rows, shipped := e.overview(p, at)
	require.Equal(t, map[string]overviewRow{
		"o-1": {Status: "shipped", Version: 3, UpdatedAt: at[1]},
		"o-2": {Status: "placed", Version: 1, UpdatedAt: at[3]},
	}, rows)
	require.Equal(t, map[string]bool{"o-1": true}, shipped)
}

func TestMatchDeadLettersFindsMissingWrongAndUnexpected(t *testing.T) {
	t.Parallel()
	h1, h2, h3 := hashOf([]byte("1")), hashOf([]byte("2")), hashOf([]byte("3"))
	want := []deadLetter{{"a", h1, "decode_error"}, {"b", h2, "payload_conflict"}}
	require.Empty(t, matchDeadLetters(want, []deadLetter{{"a", h1, "decode_error"}, {"a", h1, "decode_error"}, {"b", h2, "payload_conflict"}}),
		"a dead letter delivered twice is a copy, not a failure")
	bad := matchDeadLetters(want, []deadLetter{{"b", h2, "max_attempts"}, {"c", h3, "max_attempts"}})
	require.Len(t, bad, 3)
	require.True(t, slices.ContainsFunc(bad, func(s string) bool { return s == `"a" (decode_error) missing` }), bad)
}
