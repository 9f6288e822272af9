package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox"
)

const inboxUsage = `usage:
  idem inbox show --consumer C --id ID [--json]   print one row (exit 1 when absent)
  idem inbox stats [--json]                       rows, oldest and newest per consumer
  idem inbox horizon --consumer C [--json]       what retention made C forget, per source
  idem inbox cleanup --older-than 168h [--floor D] [--consumer C] [--chunk-size N]
                                                  the inbox alone (idem cleanup cleans every table)`

func runInbox(ctx context.Context, e *env, args []string) error {
	return group(e, inboxUsage, args, map[string]func([]string) error{
		"show":    func(args []string) error { return inboxShow(ctx, e, args) },
		"stats":   func(args []string) error { return inboxStats(ctx, e, args) },
		"horizon": func(args []string) error { return inboxHorizon(ctx, e, args) },
		"cleanup": func(args []string) error { return inboxCleanup(ctx, e, args) },
	})
}

// openInbox builds the Inbox for e's tables and connects; the caller closes
// the pool.
func openInbox(ctx context.Context, e *env) (*inbox.Inbox, *pgxpool.Pool, error) {
	ib, err := inbox.New(inbox.Config{Tables: e.tables})
	if err != nil {
		return nil, nil, err
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	return ib, pool, nil
}

func inboxShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inbox show")
	consumer := fs.String("consumer", "", "consumer name (required)")
	id := fs.String("id", "", "message id (required)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *consumer == "" || *id == "" {
		return fmt.Errorf("%w: want --consumer C --id ID", errUsage)
	}
	ib, pool, err := openInbox(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := ib.Lookup(ctx, pool, *consumer, *id)
	if errors.Is(err, inbox.ErrNotFound) {
		return fmt.Errorf("consumer %q, message id %q: not found", *consumer, *id)
	}
	if err != nil {
		return err
	}
	if e.json {
		return e.writeJSON(inboxRecordJSON{Consumer: r.Consumer, MessageID: r.MessageID, PayloadHash: r.PayloadHash.String(),
			BusinessKey: r.BusinessKey, Source: r.Source, StreamOffset: r.StreamOffset, ReceivedAt: r.ReceivedAt.UTC(),
			SeenAt: utc(r.SeenAt), SeenOffset: r.SeenOffset})
	}
	t := e.table()
	t.row("consumer", r.Consumer)
	t.row("message_id", r.MessageID)
	t.row("payload_hash", r.PayloadHash)
	t.row("business_key", orDash(r.BusinessKey))
	t.row("source", orDash(r.Source))
	t.row("stream_offset", offsetOrDash(r.StreamOffset))
	t.row("received_at", r.ReceivedAt.UTC().Format(time.RFC3339Nano))
	t.row("seen_at", timeOrDash(r.SeenAt))
	t.row("seen_offset", offsetOrDash(r.SeenOffset))
	return t.flush()
}

func inboxStats(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inbox stats")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	ib, pool, err := openInbox(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	stats, err := ib.Stats(ctx, pool)
	if err != nil {
		return err
	}
	return printRows(e, stats,
		func(s inbox.ConsumerStats) inboxStatsJSON {
			j := inboxStatsJSON{Consumer: s.Consumer, Rows: s.Rows, Estimated: s.Estimated}
			if !s.Estimated {
				j.Oldest, j.Newest = ptr(s.Oldest.UTC()), ptr(s.Newest.UTC())
			}
			return j
		},
		"CONSUMER\tROWS\tOLDEST\tNEWEST",
		func(s inbox.ConsumerStats) []any {
			if s.Estimated {
				return []any{s.Consumer, approx(s.Rows, true), "-", "-"}
			}
			return []any{s.Consumer, s.Rows, s.Oldest.UTC().Format(time.RFC3339), s.Newest.UTC().Format(time.RFC3339)}
		})
}

func ptr[T any](v T) *T { return &v }

func inboxCleanup(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inbox cleanup")
	var opts inbox.CleanupOptions
	durationFlag(fs, &opts.OlderThan, "older-than", 0, 1,
		"delete rows whose message was last seen longer ago than `D` (required; at least the floor)")
	durationFlag(fs, &opts.Floor, "floor", inbox.DefaultFloor, 1,
		"the shortest --older-than accepted: how long a message may still come back or be replayed (`D`)")
	fs.StringVar(&opts.Consumer, "consumer", "", "only this consumer's rows (default: all consumers)")
	intFlag(fs, &opts.ChunkSize, "chunk-size", inbox.DefaultChunkSize, 1, "`N` rows per DELETE, each its own transaction")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if opts.OlderThan == 0 {
		return fmt.Errorf("%w: want --older-than DURATION (e.g. 168h)", errUsage)
	}
	ib, pool, err := openInbox(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := ib.Cleanup(ctx, pool, opts)
	if errors.Is(err, inbox.ErrRetentionTooShort) {
		return belowFloor(opts.OlderThan, opts.Floor)
	}
	if err != nil {
		return err
	}
	e.printf("deleted %d rows older than %v in %d chunks\n", res.Deleted, opts.OlderThan, res.Chunks)
	return nil
}

func inboxHorizon(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inbox horizon")
	consumer := fs.String("consumer", "", "consumer name (required)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *consumer == "" {
		return fmt.Errorf("%w: want --consumer C", errUsage)
	}
	ib, pool, err := openInbox(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	hs, err := ib.Horizons(ctx, pool, *consumer)
	if err != nil {
		return err
	}
	return printRows(e, hs,
		func(h inbox.Horizon) horizonJSON {
			return horizonJSON{Consumer: h.Consumer, Source: h.Source, Offset: h.Offset, SeenAt: h.SeenAt.UTC(), UpdatedAt: h.UpdatedAt.UTC()}
		},
		"SOURCE\tFORGOTTEN_OFFSET\tFORGOTTEN_SEEN_AT\tUPDATED_AT",
		func(h inbox.Horizon) []any {
			return []any{h.Source, offsetOrDash(h.Offset), h.SeenAt.UTC().Format(time.RFC3339Nano), h.UpdatedAt.UTC().Format(time.RFC3339)}
		})
}

// belowFloor is the refusal of a cleanup below the retention floor.
func belowFloor(olderThan, floor time.Duration) error {
	return fmt.Errorf("refused, nothing deleted: --older-than %s is below the retention floor %s. Rows that young may "+
		"still be needed to recognise a redelivered or replayed message; pass --floor %s to go lower deliberately",
		olderThan, floor, olderThan)
}

func offsetOrDash(o *int64) string {
	if o == nil {
		return "-"
	}
	return strconv.FormatInt(*o, 10)
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// inboxRecordJSON is `idem inbox show --json`.
type inboxRecordJSON struct {
	Consumer     string     `json:"consumer"`
	MessageID    string     `json:"message_id"`
	PayloadHash  string     `json:"payload_hash"`
	BusinessKey  string     `json:"business_key"`
	Source       string     `json:"source"`
	StreamOffset *int64     `json:"stream_offset"`
	ReceivedAt   time.Time  `json:"received_at"`
	SeenAt       *time.Time `json:"seen_at"`
	SeenOffset   *int64     `json:"seen_offset"`
}

// inboxStatsJSON is one element of `idem inbox stats --json`.
type inboxStatsJSON struct {
	Consumer string `json:"consumer"`
	Rows     int64  `json:"rows"`
	// Estimated reports that rows is the planner's estimate; oldest and
	// newest are then null.
	Estimated bool       `json:"estimated"`
	Oldest    *time.Time `json:"oldest"`
	Newest    *time.Time `json:"newest"`
}

// horizonJSON is one element of `idem inbox horizon --json`.
type horizonJSON struct {
	Consumer  string    `json:"consumer"`
	Source    string    `json:"source"`
	Offset    *int64    `json:"forgotten_offset"`
	SeenAt    time.Time `json:"forgotten_seen_at"`
	UpdatedAt time.Time `json:"updated_at"`
}
