package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/retention"
)

func init() {
	register(command{name: "cleanup", summary: "delete what idem no longer needs from every table, never below the floor", run: runCleanup})
}

func runCleanup(ctx context.Context, e *env, args []string) error {
	fs := e.flags("cleanup")
	var cfg retention.Config
	fs.DurationVar(&cfg.OlderThan, "older-than", 0,
		"delete rows older than this (required; at least the floor): settled effects, dead letters, finished replay runs, inbox rows")
	fs.DurationVar(&cfg.Floor, "floor", retention.DefaultFloor,
		"the shortest --older-than accepted: how long a message may still come back or be replayed")
	fs.IntVar(&cfg.ChunkSize, "chunk-size", retention.DefaultChunkSize, "rows per DELETE, each its own transaction")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if cfg.OlderThan <= 0 || fs.NArg() > 0 {
		return fmt.Errorf("%w: want --older-than DURATION (e.g. 720h) and no arguments", errUsage)
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
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "TABLE\tDELETED\t(older than %s: before %s)\n", cfg.OlderThan, res.Cutoff.UTC().Format(time.RFC3339))
	for _, c := range res.Counts {
		fmt.Fprintf(w, "%s\t%d\n", e.tables.WithDefaults().Prefix+c.Table, c.Deleted)
	}
	if ferr := w.Flush(); ferr != nil {
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
