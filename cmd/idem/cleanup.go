package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/retention"
)

func runCleanup(ctx context.Context, e *env, args []string) error {
	fs := e.flags("cleanup")
	var cfg retention.Config
	durationFlag(fs, &cfg.OlderThan, "older-than", 0, 1,
		"delete rows older than `D` (required; at least the floor): inbox rows, dead letters, finished replay runs, attempt counts")
	durationFlag(fs, &cfg.LedgerOlderThan, "ledger-older-than", 0, 1,
		"delete effects settled longer than `D` ago, with their audit rows; each leaves a tombstone (at least the floor; "+
			"default: the longer of --older-than and "+retention.DefaultLedgerOlderThan.String()+")")
	durationFlag(fs, &cfg.TombstonesOlderThan, "tombstones-older-than", 0, 1,
		"delete the tombstones of effects deleted longer than `D` ago; an effect recorded again after its tombstone went is sent "+
			"again (at least the floor; default: tombstones are kept)")
	durationFlag(fs, &cfg.Floor, "floor", retention.DefaultFloor, 0,
		"the shortest `D` --older-than, --ledger-older-than and --tombstones-older-than accept: how long a message may still come back or be replayed")
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
		return belowFloorOf(cfg)
	}
	if err != nil && res.Total() == 0 {
		return err
	}
	if e.json {
		out := cleanupJSON{Cutoff: at(res.Cutoff), Tables: []cleanupCountJSON{}}
		for _, c := range res.Counts {
			out.Tables = append(out.Tables, cleanupCountJSON{Table: c.Table, Cutoff: at(c.Cutoff), Deleted: c.Deleted, Partitions: c.Partitions})
		}
		if jerr := e.writeJSON(out); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	t := e.table()
	t.row("TABLE", "DELETED", "KEEPS")
	for _, c := range res.Counts {
		t.row(e.tables.WithDefaults().Prefix+c.Table, c.Deleted, keeps(c))
	}
	if ferr := t.flush(); ferr != nil {
		return errors.Join(err, ferr)
	}
	for _, c := range res.Counts {
		if c.Partitions > 0 {
			e.printf("%s%s: dropped %d whole partitions\n", e.tables.WithDefaults().Prefix, c.Table, c.Partitions)
		}
	}
	return err
}

// keeps says what a table keeps after a cleanup.
func keeps(c retention.Count) string {
	switch {
	case !c.Cutoff.IsZero():
		return "since " + c.Cutoff.UTC().Format(time.RFC3339)
	case c.Table == "http_keys":
		return "until their expiry"
	}
	return "all"
}

// cleanupJSON is `idem cleanup --json`.
type cleanupJSON struct {
	Cutoff *time.Time         `json:"cutoff"`
	Tables []cleanupCountJSON `json:"tables"`
}

// cleanupCountJSON is one table of cleanupJSON; Cutoff is null when the
// table keeps what age does not decide (HTTP keys, kept tombstones).
type cleanupCountJSON struct {
	Table   string     `json:"table"`
	Cutoff  *time.Time `json:"cutoff"`
	Deleted int64      `json:"deleted"`
	// Partitions is how many whole partitions of a partitioned inbox
	// were dropped; omitted for other tables.
	Partitions int `json:"partitions,omitempty"`
}

// belowFloorOf names the first age of cfg that is below its floor.
func belowFloorOf(cfg retention.Config) error {
	for _, a := range []struct {
		flag string
		age  time.Duration
	}{{"ledger-older-than", cfg.LedgerOlderThan}, {"tombstones-older-than", cfg.TombstonesOlderThan}} {
		if a.age != 0 && a.age < cfg.Floor && cfg.OlderThan >= cfg.Floor {
			return fmt.Errorf("refused, nothing deleted: --%s %s is below the retention floor %s; pass --floor %s to go lower deliberately",
				a.flag, a.age, cfg.Floor, a.age)
		}
	}
	return belowFloor(cfg.OlderThan, cfg.Floor)
}
