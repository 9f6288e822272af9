package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The retention fault cleans every example's inbox at the floor while the
// load and the other faults go on, then tries each door through which a
// message can come back: a normal replay of the orders stream and a
// redrive of the queues' dead letters. It runs what an operator runs, the
// built idem command line and the orders binary's replay subcommand.
//
// The floor is W, the run's retention window: OlderThan = Floor = W. A
// cleanup deletes the rows whose message was last seen (any copy claimed)
// longer than W ago, so W must be longer than any time after which the soak
// itself may still deliver another copy of a message. A shorter W would
// break the retention contract by design and find no bug. Two things set
// how far apart two copies can come:
//
//   - the publisher: a duplicate or a conflicting payload comes at most 50
//     of its example's messages after the original (generator.delay); the
//     plan gives the longest such gap in time at the run's rate
//     (plan.copyGap, about 4s at -rate 60 with four examples);
//   - the faults: a killed or crashed worker's unacknowledged deliveries
//     come back once it runs again (a second or two, up to 1 + MaxCrashes
//     deaths in a row for a poison message, about 7s), closed connections
//     are reopened within a second or two, a hung handler holds its
//     message for HandlerTimeout (2s) per attempt, and the backlog a worker
//     builds meanwhile drains within seconds at the soak's rates.
//
// retentionSlack bounds the second with room to spare: W = copyGap +
// retentionSlack, rounded up to the second (about 20s for make soak). A
// message that comes back after W anyway is applied twice, and the checks
// say so.
const retentionSlack = 15 * time.Second

// retentionLead is how long after W the first cleanup comes at the
// earliest: long enough for a few seconds of rows to be older than W.
const retentionLead = 5 * time.Second

// operatorTimeout bounds each command the retention fault runs.
const operatorTimeout = time.Minute

// retentionFloor is W for plan p published at rate (see retentionSlack).
func retentionFloor(p plan, rate float64) time.Duration {
	return (p.copyGap(rate) + retentionSlack + time.Second - 1).Truncate(time.Second)
}

// doorKind is one of the ways the retention fault goes through.
type doorKind string

const (
	// doorCleanup is idem inbox cleanup at the floor on one example.
	doorCleanup doorKind = "cleanup"
	// doorReplayBelow is a normal replay of the orders stream from first:
	// it must be refused.
	doorReplayBelow doorKind = "replay from first"
	// doorReplayAbove is a normal replay of the orders stream from just
	// above the horizon to the tail: it must run.
	doorReplayAbove doorKind = "replay above the horizon"
	// doorRedrive is idem deadletters redrive of a queue's dead letters:
	// it must leave in the dead-letter queue what entered it by the
	// horizon, and move the rest.
	doorRedrive doorKind = "redrive"
)

// door is what one door did, and what was wrong with that.
type door struct {
	Door     doorKind `json:"door"`
	Target   string   `json:"target"` // the schema, the stream or the dead-letter queue
	Exit     int      `json:"exit"`
	Did      string   `json:"did"`
	Problems []string `json:"problems,omitempty"`
}

// horizon is an element of idem inbox horizon --json: what retention made a
// consumer forget of one source.
type horizon struct {
	Source string    `json:"source"`
	Offset *int64    `json:"forgotten_offset"`
	SeenAt time.Time `json:"forgotten_seen_at"`
}

// retention cleans every example's inbox at the floor and goes through the
// doors, in the background and one retention fault at a time, while the
// load and the other faults go on; the run does not settle before it is
// done. Recovery is the time until a message published after it was
// processed in every example.
func (in *injector) retention(ctx context.Context, inj *injection) error {
	h := in.h
	in.retentions++
	operator := fmt.Sprintf("soak-retention-%d", in.retentions)
	inj.Target = "all workers"
	inj.Detail = fmt.Sprintf("idem inbox cleanup --older-than %s --floor %s, then normal replays of %s and redrives", h.floor, h.floor, h.stream)
	h.retaining.Add(1)
	in.wg.Go(func() {
		defer h.retaining.Add(-1)
		in.retentionMu.Lock()
		defer in.retentionMu.Unlock()
		doors := h.retentionDoors(ctx, operator)
		in.mu.Lock()
		inj.Doors = doors
		inj.Outcome = doorsOutcome(doors)
		in.mu.Unlock()
	})
	in.watch(ctx, inj, time.Now(), h.cfg.examples)
	return nil
}

// retentionDoors cleans every example's inbox, then replays the orders
// stream and redrives the queues' dead letters.
func (h *harness) retentionDoors(ctx context.Context, operator string) []door {
	var doors []door
	horizons := map[example][]horizon{}
	for _, ex := range h.cfg.examples {
		d, hs := h.cleanInbox(ctx, ex)
		doors = append(doors, d)
		horizons[ex] = hs
	}
	doors = append(doors, h.replayDoors(ctx, horizons[orders])...)
	for _, ex := range []example{quickstart, payments} {
		if h.cfg.runs(ex) {
			doors = append(doors, h.redriveDoor(ctx, ex, horizons[ex], operator))
		}
	}
	return doors
}

// cleanInbox runs idem inbox cleanup at the floor on ex's consumer and
// returns what it did and the horizons it left.
func (h *harness) cleanInbox(ctx context.Context, ex example) (door, []horizon) {
	d := door{Door: doorCleanup, Target: h.schema(ex)}
	before, err := h.db.inboxRows(ctx, ex)
	if err != nil {
		return d.failed(err), nil
	}
	out, ran := h.operate(ctx, h.idem, "inbox", "cleanup", "--schema", h.schema(ex), "--consumer", consumerNames[ex],
		"--older-than", h.floor.String(), "--floor", h.floor.String())
	// Whatever the command did, even stopped midway, the soak must know
	// which rows it deleted.
	after, err := h.db.inboxRows(ctx, ex)
	if err != nil {
		return d.failed(errors.Join(ran, err)), nil
	}
	gone := deletedRows(before, after)
	h.db.forget(ex, gone)
	if ran != nil {
		return d.failed(ran), nil
	}
	d.Exit = out.code
	var deleted int
	if _, err := fmt.Sscanf(out.stdout, "deleted %d rows", &deleted); err != nil || out.code != 0 {
		return d.failed(fmt.Errorf("idem inbox cleanup exited %d: %s", out.code, out.text())), nil
	}
	now, err := h.db.now(ctx)
	if err != nil {
		return d.failed(err), nil
	}
	hs, err := h.horizons(ctx, ex)
	if err != nil {
		return d.failed(err), nil
	}
	d.Problems = judgeCleanup(deleted, gone, hs, now.Add(-h.floor))
	d.Did = fmt.Sprintf("deleted %d rows", deleted)
	for _, hz := range hs {
		d.Did += "; horizon of " + hz.Source + ": " + hz.String()
	}
	return d, hs
}

// deletedRows returns the rows of before that are gone from after, or that
// after holds anew (received later: deleted, then claimed again).
func deletedRows(before, after map[string]inboxRow) map[string]inboxRow {
	gone := map[string]inboxRow{}
	for id, r := range before {
		if a, ok := after[id]; !ok || !a.received.Equal(r.received) {
			gone[id] = r
		}
	}
	return gone
}

// horizons runs idem inbox horizon for ex's consumer.
func (h *harness) horizons(ctx context.Context, ex example) ([]horizon, error) {
	out, err := h.operate(ctx, h.idem, "inbox", "horizon", "--schema", h.schema(ex), "--consumer", consumerNames[ex], "--json")
	if err != nil {
		return nil, err
	}
	if out.code != 0 {
		return nil, fmt.Errorf("idem inbox horizon exited %d: %s", out.code, out.text())
	}
	var hs []horizon
	if err := json.Unmarshal([]byte(out.stdout), &hs); err != nil {
		return nil, fmt.Errorf("idem inbox horizon --json: %w", err)
	}
	return hs, nil
}

// replayDoors replays the orders stream in normal mode, from first (which
// must be refused) and from just above the horizon to the tail (which must
// run and process nothing the live consumer had processed).
func (h *harness) replayDoors(ctx context.Context, hs []horizon) []door {
	below := door{Door: doorReplayBelow, Target: h.stream}
	above := door{Door: doorReplayAbove, Target: h.stream}
	i := slices.IndexFunc(hs, func(hz horizon) bool { return hz.Source == h.stream && hz.Offset != nil })
	if i < 0 {
		err := errors.New("the cleanup forgot no message of the stream: there is no horizon to ask")
		return []door{below.failed(err), above.failed(err)}
	}
	off := *hs[i].Offset
	out, err := h.operate(ctx, h.bins[orders], h.ordersArgs("replay", "--mode", "normal", "--from", "first", "--to", "tail")...)
	if err != nil {
		below = below.failed(err)
	} else {
		below.Exit, below.Problems = out.code, judgeReplayBelow(out, off, h.stream)
		below.Did = firstLineWith(out.stderr, "horizon")
	}
	live, err := h.db.checkpoint(ctx, h.stream)
	if err != nil {
		return []door{below, above.failed(err)}
	}
	out, err = h.operate(ctx, h.bins[orders], h.ordersArgs("replay", "--mode", "normal", "--from", strconv.FormatInt(off+1, 10), "--to", "tail")...)
	if err != nil {
		return []door{below, above.failed(err)}
	}
	s, ok := parseReplaySummary(out.stderr)
	above.Exit, above.Problems = out.code, judgeReplayAbove(out, s, ok, off, live)
	above.Did = fmt.Sprintf("from %d (the live consumer at %d): %s", off+1, live, s)
	return []door{below, above}
}

// redriveDoor redrives the dead letters of ex's queue and returns what it
// did, judged against what the dead-letter queue held and the consumer's
// horizons hs.
func (h *harness) redriveDoor(ctx context.Context, ex example, hs []horizon, operator string) door {
	dlq := h.queue(ex) + ".dlq"
	d := door{Door: doorRedrive, Target: dlq}
	newest, forgot := newestSighting(hs)
	queued, _, err := h.readDLQ(ctx, dlq)
	if err != nil {
		return d.failed(err)
	}
	rows, err := h.db.deadLetterRows(ctx, ex)
	if err != nil {
		return d.failed(err)
	}
	want := expectRefused(queued, rows, newest, forgot)
	out, err := h.operate(ctx, h.idem, "deadletters", "redrive", "--schema", h.schema(ex), "--queue", h.queue(ex),
		"--operator", operator, "--json")
	if err != nil {
		return d.failed(err)
	}
	d.Exit = out.code
	var got redriveResult
	if err := json.Unmarshal([]byte(out.stdout), &got); err != nil {
		return d.failed(fmt.Errorf("idem deadletters redrive exited %d: %s", out.code, out.text()))
	}
	if rows, err = h.db.deadLetterRows(ctx, ex); err != nil {
		return d.failed(err)
	}
	var moved []deadLetterRow
	for _, r := range rows {
		if r.redrivenBy == operator {
			moved = append(moved, r)
		}
	}
	d.Problems = judgeRedrive(out, got, want, moved, newest, forgot)
	d.Did = fmt.Sprintf("looked at %d: refused %d (%d had entered by the newest forgotten sighting %s), moved %d",
		got.Scanned, got.Refused, want, stamp(newest), got.Moved)
	return d
}

// redriveResult is idem deadletters redrive --json.
type redriveResult struct {
	Scanned int `json:"scanned"`
	Moved   int `json:"moved"`
	Refused int `json:"refused"`
}

// ordersArgs are the orders binary's arguments for this run, then args.
func (h *harness) ordersArgs(args ...string) []string {
	return append([]string{"-schema", h.schema(orders), "-stream", h.stream, "-mail", h.mailURL + "/send"}, args...)
}

// operated is what an operator's command did.
type operated struct {
	code           int
	stdout, stderr string
}

// text is what the command printed, on one line.
func (o operated) text() string {
	return strings.Join(strings.Fields(o.stdout+" "+o.stderr), " ")
}

// operate runs bin with args as an operator would, on the run's database
// and broker, within operatorTimeout. Its database sessions carry an
// application_name of their own, so the backends fault spares them. An
// error means it could not run to its end.
func (h *harness) operate(ctx context.Context, bin string, args ...string) (operated, error) {
	pgURL, err := withAppName(h.cfg.pgURL, "soak_"+h.run+"_operator")
	if err != nil {
		return operated{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, operatorTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), h.env(pgURL)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	out := operated{stdout: stdout.String(), stderr: stderr.String()}
	name := filepath.Base(bin) + " " + strings.Join(args, " ")
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && ctx.Err() == nil {
		out.code = ee.ExitCode()
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", name, err, out.text())
	}
	return out, nil
}

// failed records that the door could not be gone through.
func (d door) failed(err error) door {
	d.Problems = append(d.Problems, err.Error())
	return d
}

// doorsOutcome sums up a retention fault's doors for its report line.
func doorsOutcome(doors []door) string {
	problems := 0
	for _, d := range doors {
		problems += len(d.Problems)
	}
	if problems == 0 {
		return fmt.Sprintf("%d doors, every one as it should", len(doors))
	}
	return fmt.Sprintf("%d doors, %d PROBLEMS", len(doors), problems)
}

func (hz horizon) String() string {
	s := "last seen until " + stamp(hz.SeenAt)
	if hz.Offset != nil {
		s = fmt.Sprintf("offsets up to %d, %s", *hz.Offset, s)
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// firstLineWith returns the first line of s that contains sub, or s's
// first line.
func firstLineWith(s, sub string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return lines[0]
}
