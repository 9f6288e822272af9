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

func init() {
	register(command{name: "inbox", summary: "show an inbox row, per-consumer stats, or clean up expired rows",
		subcommands: []string{"show", "stats", "cleanup"}, run: runInbox})
}

const inboxUsage = `usage:
  idem inbox show --consumer C --id ID [--json]   print one row (exit 1 when absent)
  idem inbox stats [--json]                       rows, oldest and newest per consumer
  idem inbox cleanup --older-than 168h [--consumer C] [--chunk-size N]
                                                  the inbox alone (idem cleanup cleans every table)`

func runInbox(ctx context.Context, e *env, args []string) error {
	return group(e, inboxUsage, args, map[string]func([]string) error{
		"show":    func(args []string) error { return inboxShow(ctx, e, args) },
		"stats":   func(args []string) error { return inboxStats(ctx, e, args) },
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
			BusinessKey: r.BusinessKey, Source: r.Source, StreamOffset: r.StreamOffset, ReceivedAt: r.ReceivedAt.UTC()})
	}
	offset := "-"
	if r.StreamOffset != nil {
		offset = strconv.FormatInt(*r.StreamOffset, 10)
	}
	t := e.table()
	t.row("consumer", r.Consumer)
	t.row("message_id", r.MessageID)
	t.row("payload_hash", r.PayloadHash)
	t.row("business_key", orDash(r.BusinessKey))
	t.row("source", orDash(r.Source))
	t.row("stream_offset", offset)
	t.row("received_at", r.ReceivedAt.UTC().Format(time.RFC3339Nano))
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
			return inboxStatsJSON{Consumer: s.Consumer, Rows: s.Rows, Oldest: s.Oldest.UTC(), Newest: s.Newest.UTC()}
		},
		"CONSUMER\tROWS\tOLDEST\tNEWEST",
		func(s inbox.ConsumerStats) []any {
			return []any{s.Consumer, s.Rows, s.Oldest.UTC().Format(time.RFC3339), s.Newest.UTC().Format(time.RFC3339)}
		})
}

func inboxCleanup(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inbox cleanup")
	var opts inbox.CleanupOptions
	durationFlag(fs, &opts.OlderThan, "older-than", 0, 1,
		"delete rows received longer ago than `D` (required; at least 72h; longer than any redelivery or replay horizon)")
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
	if err != nil {
		return err
	}
	e.printf("deleted %d rows older than %v in %d chunks\n", res.Deleted, opts.OlderThan, res.Chunks)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// inboxRecordJSON is `idem inbox show --json`.
type inboxRecordJSON struct {
	Consumer     string    `json:"consumer"`
	MessageID    string    `json:"message_id"`
	PayloadHash  string    `json:"payload_hash"`
	BusinessKey  string    `json:"business_key"`
	Source       string    `json:"source"`
	StreamOffset *int64    `json:"stream_offset"`
	ReceivedAt   time.Time `json:"received_at"`
}

// inboxStatsJSON is one element of `idem inbox stats --json`.
type inboxStatsJSON struct {
	Consumer string    `json:"consumer"`
	Rows     int64     `json:"rows"`
	Oldest   time.Time `json:"oldest"`
	Newest   time.Time `json:"newest"`
}
