package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/replay"
)

const replayUsage = `usage:
  idem replay runs [--consumer C] [--limit N] [--json]   newest first, with their audit counts
  idem replay abandon RUN_ID                             drop an interrupted online rebuild's shadow tables
Replays themselves run from the worker binary (replaycmd.Main), next to the handler.`

func runReplay(ctx context.Context, e *env, args []string) error {
	return group(e, replayUsage, args, map[string]func([]string) error{
		"runs":    func(args []string) error { return replayRuns(ctx, e, args) },
		"abandon": func(args []string) error { return replayAbandon(ctx, e, args) },
	})
}

// replayAbandon gives up an interrupted online rebuild: its shadow tables
// are dropped, the live projection is untouched.
func replayAbandon(ctx context.Context, e *env, args []string) error {
	fs := e.flags("replay abandon")
	var runID string
	if err := e.parse(fs, args, &runID); err != nil {
		return err
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := replay.Abandon(ctx, pool, e.tables, runID); err != nil {
		return err
	}
	e.printf("run %s abandoned: its shadow tables are dropped\n", runID)
	return nil
}

func replayRuns(ctx context.Context, e *env, args []string) error {
	fs := e.flags("replay runs")
	var f replay.RunFilter
	fs.StringVar(&f.Consumer, "consumer", "", "only this consumer's runs")
	intFlag(fs, &f.Limit, "limit", 50, 1, "newest `N`")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	runs, err := replay.ListRuns(ctx, pool, e.tables, f)
	if err != nil {
		return err
	}
	return printRows(e, runs, newRunJSON,
		"RUN_ID\tMODE\tCONSUMER\tSTREAM\tRANGE\tSTATUS\tSTARTED\tFINISHED\tAUDITED\tDEAD_LETTERED\tOPERATOR\tREASON",
		func(r replay.RunRecord) []any {
			status, finished := "unfinished", "-"
			switch {
			case r.Finished:
				status, finished = "finished", r.FinishedAt.UTC().Format(time.RFC3339)
			case r.Abandoned:
				status, finished = "abandoned", r.FinishedAt.UTC().Format(time.RFC3339)
			}
			return []any{r.ID, r.Mode, r.Consumer, r.Stream, fmt.Sprintf("%s..%s (end %d)", r.From, r.To, r.End), status,
				r.StartedAt.UTC().Format(time.RFC3339), finished, r.Audited, r.DeadLettered, orDash(r.Operator),
				orDash(oneLine(r.Reason, 60))}
		})
}

// runJSON is one element of `idem replay runs --json`.
type runJSON struct {
	RunID         string     `json:"run_id"`
	Mode          string     `json:"mode"`
	Consumer      string     `json:"consumer"`
	Stream        string     `json:"stream"`
	From          string     `json:"from"`
	To            string     `json:"to"`
	EndOffset     int64      `json:"end_offset"`
	HandoffOffset *int64     `json:"handoff_offset"`
	Finished      bool       `json:"finished"`
	Abandoned     bool       `json:"abandoned"`
	StartedAt     *time.Time `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	Audited       int64      `json:"audited"`
	DeadLettered  int64      `json:"dead_lettered"`
	Operator      string     `json:"operator"`
	Reason        string     `json:"reason"`
}

func newRunJSON(r replay.RunRecord) runJSON {
	return runJSON{RunID: r.ID, Mode: string(r.Mode), Consumer: r.Consumer, Stream: r.Stream, From: r.From, To: r.To,
		EndOffset: r.End, HandoffOffset: r.Handoff, Finished: r.Finished, Abandoned: r.Abandoned, StartedAt: at(r.StartedAt),
		FinishedAt: at(r.FinishedAt), Audited: r.Audited, DeadLettered: r.DeadLettered, Operator: r.Operator, Reason: r.Reason}
}
