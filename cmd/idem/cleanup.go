package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/retention"
)

func init() {
	register(command{name: "cleanup", summary: "delete what idem no longer needs from every table, never below the floor", run: runCleanup})
}

func runCleanup(ctx context.Context, e *env, args []string) error {
	fs := e.flags("cleanup")
	var cfg retention.Config
	durationFlag(fs, &cfg.OlderThan, "older-than", 0, 1,
		"delete rows older than `D` (required; at least the floor): settled effects, dead letters, finished replay runs, inbox rows")
	durationFlag(fs, &cfg.Floor, "floor", retention.DefaultFloor, 0,
		"the shortest `D` --older-than accepts: how long a message may still come back or be replayed")
	intFlag(fs, &cfg.ChunkSize, "chunk-size", retention.DefaultChunkSize, 1, "`N` rows per DELETE, each its own transaction")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if cfg.OlderThan == 0 {
		return fmt.Errorf("%w: want --older-than DURATION (e.g. 720h)", errUsage)
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool, cfg.Tables = pool, e.tables
	res, err := retention.Clean(ctx, cfg)
	if errors.Is(err, retention.ErrBelowFloor) {
		return belowFloor(cfg.OlderThan, cfg.Floor)
	}
	if err != nil && res.Total() == 0 {
		return err
	}
	if e.json {
		out := cleanupJSON{Cutoff: at(res.Cutoff), Tables: []cleanupCountJSON{}}
		for _, c := range res.Counts {
			out.Tables = append(out.Tables, cleanupCountJSON{Table: c.Table, Deleted: c.Deleted})
		}
		if jerr := e.writeJSON(out); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	t := e.table()
	t.row("TABLE", "DELETED", fmt.Sprintf("(older than %s: before %s)", cfg.OlderThan, res.Cutoff.UTC().Format(time.RFC3339)))
	for _, c := range res.Counts {
		t.row(e.tables.WithDefaults().Prefix+c.Table, c.Deleted)
	}
	if ferr := t.flush(); ferr != nil {
		return errors.Join(err, ferr)
	}
	return err
}

// cleanupJSON is `idem cleanup --json`.
type cleanupJSON struct {
	Cutoff *time.Time         `json:"cutoff"`
	Tables []cleanupCountJSON `json:"tables"`
}

type cleanupCountJSON struct {
	Table   string `json:"table"`
	Deleted int64  `json:"deleted"`
}
