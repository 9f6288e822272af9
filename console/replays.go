package console

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/replay"
)

// maxRuns is how many runs the replays screen lists, newest first.
const maxRuns = 100

// runView is a replay run with its progress.
type runView struct {
	replay.RunRecord
	// Done is the last offset its checkpoint reached; nil before its first
	// batch.
	Done *int64
	// DoneAt is when that checkpoint moved.
	DoneAt time.Time
}

// Percent is how far the run got through its range, when it tells.
func (v runView) Percent() string {
	if v.Done == nil || v.End < 0 {
		return ""
	}
	if v.Finished {
		return "100%"
	}
	if v.End == 0 {
		return "0%"
	}
	return fmt.Sprintf("%d%%", min(100, *v.Done*100/v.End))
}

// Interrupted reports a run that did not finish and was not abandoned: it
// runs now, or it was interrupted and waits to be resumed or abandoned.
func (v runView) Interrupted() bool { return !v.Finished && !v.Abandoned }

// Online reports an online rebuild, which can be abandoned.
func (v runView) Online() bool { return v.Mode == idem.Rebuild && v.Projection != "" }

// replaysData is the replays screen.
type replaysData struct {
	Runs  []runView
	Limit int
}

// replays lists the runs (replay.ListRuns) with their progress, and what to
// do with an interrupted one.
func (c *Console) replays(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	runs, err := replay.ListRuns(ctx, c.cfg.Pool, c.cfg.Tables, replay.RunFilter{Limit: maxRuns})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	views, err := c.store.progress(ctx, runs)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, s, http.StatusOK, "replays", "Replays", replaysData{Runs: views, Limit: maxRuns})
}

// progress adds each run's checkpoint. Console query: replay keeps a run's
// progress in its checkpoint and no library function reads it.
func (s *store) progress(ctx context.Context, runs []replay.RunRecord) ([]runView, error) {
	out := make([]runView, len(runs))
	ids, consumers, streams := make([]string, len(runs)), make([]string, len(runs)), make([]string, len(runs))
	at := map[string]int{}
	for i, r := range runs {
		out[i].RunRecord = r
		ids[i], consumers[i], streams[i] = r.ID, r.Consumer, r.Stream
		at[r.ID] = i
	}
	if len(runs) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, s.sql.runProgress, ids, consumers, streams)
	if err != nil {
		return nil, fmt.Errorf("replay progress: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id     string
			offset int64
			when   time.Time
		)
		if err := rows.Scan(&id, &offset, &when); err != nil {
			return nil, fmt.Errorf("replay progress: %w", err)
		}
		v := &out[at[id]]
		v.Done, v.DoneAt = &offset, when
	}
	return out, rows.Err()
}

// abandonRun abandons an interrupted online rebuild (replay.Abandon): its
// shadow tables are dropped, the live projection is untouched. replay
// refuses while a process runs the rebuild.
func (c *Console) abandonRun(w http.ResponseWriter, r *http.Request, s *session) {
	c.resolveEach(w, r, s, "Abandon rebuild", "/replays", func(ctx context.Context, id, _ string) (string, error) {
		if err := replay.Abandon(ctx, c.cfg.Pool, c.cfg.Tables, id); err != nil {
			return "", err
		}
		return "abandoned (shadow tables dropped)", nil
	}, replay.ErrRebuildRunning, replay.ErrRunMismatch)
}
