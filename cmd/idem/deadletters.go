package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/safetext"
)

const deadLettersUsage = `usage:
  idem deadletters list [--consumer C] [--id ID] [--reason R] [--limit N] [--before ID] [--json]
  idem deadletters list --group-by reason|consumer,reason [--consumer C] [--limit N] [--count-cap N] [--json]
      the dead letters not redriven, by group, largest first, with their count, oldest and newest
  idem deadletters redrive --queue Q [--reason R] [--id ID] [--consumer C] [--limit N] [--operator NAME]
                          [--allow-beyond-horizon] [--json]
      moves matching messages from Q's dead-letter queue back to Q (broker: --amqp-url, else IDEM_AMQP_URL)`

func runDeadLetters(ctx context.Context, e *env, args []string) error {
	return group(e, deadLettersUsage, args, map[string]func([]string) error{
		"list":    func(args []string) error { return deadLettersList(ctx, e, args) },
		"redrive": func(args []string) error { return deadLettersRedrive(ctx, e, args) },
	})
}

func deadLettersList(ctx context.Context, e *env, args []string) error {
	fs := e.flags("deadletters list")
	var f deadletters.Filter
	fs.StringVar(&f.Consumer, "consumer", "", "only this consumer")
	fs.StringVar(&f.MessageID, "id", "", "only this message id")
	fs.StringVar(&f.Reason, "reason", "", "only this reason (payload_conflict, max_attempts, …)")
	intFlag(fs, &f.Limit, "limit", 50, 1, "newest `N` (groups: the first N groups)")
	var before int
	intFlag(fs, &before, "before", 0, 0, "the page of rows older than the row with this `ID` (printed under a full page)")
	groupBy := fs.String("group-by", "", "group the dead letters not redriven: reason, or consumer,reason")
	var countCap int
	intFlag(fs, &countCap, "count-cap", deadletters.DefaultCountCap, 1, "with --group-by: count at most `N` per group (a group with more shows N+)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	f.Before = int64(before)
	if *groupBy != "" {
		g := deadletters.GroupFilter{By: deadletters.GroupBy(*groupBy), Consumer: f.Consumer, CountCap: countCap, Limit: f.Limit}
		if g.By != deadletters.ByReason && g.By != deadletters.ByConsumerReason {
			return fmt.Errorf("%w: --group-by must be %s or %s", errUsage, deadletters.ByReason, deadletters.ByConsumerReason)
		}
		if f.MessageID != "" || f.Reason != "" || f.Before != 0 {
			return fmt.Errorf("%w: --group-by takes --consumer, --limit and --count-cap only", errUsage)
		}
		return deadLetterGroups(ctx, e, g)
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := deadletters.List(ctx, pool, e.tables, f)
	if err != nil {
		return err
	}
	err = printRows(e, rows, newDeadLetterJSON,
		"ID\tAT\tCONSUMER\tMESSAGE ID\tREASON\tATTEMPTS\tSOURCE\tPAYLOAD HASH\tREDRIVEN\tERROR",
		func(d deadletters.Record) []any {
			redriven := "-"
			if !d.RedrivenAt.IsZero() {
				redriven = d.RedrivenAt.UTC().Format(time.RFC3339)
				if d.RedrivenBy != "" {
					redriven += " by " + d.RedrivenBy
				}
			}
			return []any{d.ID, d.At.UTC().Format(time.RFC3339), d.Consumer, d.MessageID, d.Reason, d.Attempts, d.Source,
				d.PayloadHash.Short(), redriven, safetext.Abbreviate(d.Error, 80)}
		})
	if err == nil && len(rows) == f.Limit {
		e.nextPage(fmt.Sprintf("--before %d", rows[len(rows)-1].ID))
	}
	return err
}

// deadLetterGroups prints the groups g selects, largest first.
func deadLetterGroups(ctx context.Context, e *env, g deadletters.GroupFilter) error {
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	groups, more, err := deadletters.Groups(ctx, pool, e.tables, g)
	if err != nil {
		return err
	}
	slices.SortStableFunc(groups, func(a, b deadletters.Group) int { return cmp.Compare(b.Count, a.Count) })
	header := "REASON\tCOUNT\tOLDEST\tNEWEST"
	if g.By == deadletters.ByConsumerReason || g.Consumer != "" {
		header = "CONSUMER\t" + header
	}
	err = printRows(e, groups, newGroupJSON, header, func(gr deadletters.Group) []any {
		count := fmt.Sprint(gr.Count)
		if gr.Capped {
			count += "+"
		}
		cells := []any{gr.Reason, count, gr.Oldest.UTC().Format(time.RFC3339), gr.Newest.UTC().Format(time.RFC3339)}
		if strings.HasPrefix(header, "CONSUMER") {
			cells = append([]any{gr.Consumer}, cells...)
		}
		return cells
	})
	if err == nil && more {
		fmt.Fprintf(e.stderr, "more groups follow: raise --limit (%d)\n", g.Limit)
	}
	return err
}

// groupJSON is one element of `idem deadletters list --group-by … --json`.
type groupJSON struct {
	Consumer string `json:"consumer"`
	Reason   string `json:"reason"`
	Count    int64  `json:"count"`
	// Capped says the group holds more than count dead letters.
	Capped bool       `json:"capped"`
	Oldest *time.Time `json:"oldest"`
	Newest *time.Time `json:"newest"`
}

func newGroupJSON(g deadletters.Group) groupJSON {
	return groupJSON{Consumer: g.Consumer, Reason: g.Reason, Count: g.Count, Capped: g.Capped, Oldest: at(g.Oldest), Newest: at(g.Newest)}
}

func deadLettersRedrive(ctx context.Context, e *env, args []string) error {
	fs := e.flags("deadletters redrive")
	var o deadletters.RedriveOptions
	fs.StringVar(&o.Queue, "queue", "", "the queue to move messages back to (required); they are taken from its dead-letter queue")
	fs.StringVar(&o.DeadLetterQueue, "dlq", "", "the dead-letter queue (default: "+deadletters.QueueName("QUEUE")+")")
	fs.StringVar(&o.Reason, "reason", "", "only messages dead-lettered for this reason")
	fs.StringVar(&o.MessageID, "id", "", "only the message with this id (the one its dead-letter row records)")
	fs.StringVar(&o.Consumer, "consumer", "", "only messages this consumer dead-lettered; judges those the broker dead-lettered for it")
	intFlag(fs, &o.Limit, "limit", 0, 0, "move at most `N` messages (default: every matching one)")
	operator := e.operatorFlag(fs, "who redrives, recorded on each dead-letter row")
	fs.BoolVar(&o.AllowBeyondHorizon, "allow-beyond-horizon", false,
		"also move messages that entered the dead-letter queue before the consumer's inbox horizon: they will be applied as new")
	amqpURL := fs.String("amqp-url", "", "RabbitMQ URL, or a cluster's node URLs separated by commas (default: $IDEM_AMQP_URL)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	o.Operator = *operator
	if o.Queue == "" {
		return fmt.Errorf("%w: want --queue Q", errUsage)
	}
	list := *amqpURL
	if list == "" {
		list = os.Getenv("IDEM_AMQP_URL")
	}
	if list == "" {
		return fmt.Errorf("%w: no broker: set IDEM_AMQP_URL or --amqp-url", errUsage)
	}
	var err error
	if o.AMQPURLs, err = amqpnodes.Split(list); err != nil {
		return fmt.Errorf("%w: --amqp-url or IDEM_AMQP_URL: %w", errUsage, err)
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	o.Pool, o.Tables = pool, e.tables
	res, err := deadletters.Redrive(ctx, o)
	if e.json {
		if jerr := e.writeJSON(newRedriveJSON(res)); jerr != nil {
			return errors.Join(err, jerr)
		}
	} else if err == nil || res.Scanned > 0 {
		if perr := printRedrive(e, o, res); perr != nil {
			return errors.Join(err, perr)
		}
	}
	if err != nil && !errors.Is(err, deadletters.ErrNoDeadLetterQueue) {
		return fmt.Errorf("%w; what was not moved is still in %s", err, dlqName(o))
	}
	return err
}

func dlqName(o deadletters.RedriveOptions) string {
	if o.DeadLetterQueue != "" {
		return o.DeadLetterQueue
	}
	return deadletters.QueueName(o.Queue)
}

// deadLetterJSON is one element of `idem deadletters list --json`. The
// payload itself is not printed; has_payload says whether the row keeps it.
type deadLetterJSON struct {
	ID           int64      `json:"id"`
	Consumer     string     `json:"consumer"`
	MessageID    string     `json:"message_id"`
	PayloadHash  string     `json:"payload_hash"`
	StoredHash   *string    `json:"stored_hash"`
	Reason       string     `json:"reason"`
	Error        string     `json:"error"`
	Source       string     `json:"source"`
	Exchange     string     `json:"exchange"`
	RoutingKey   string     `json:"routing_key"`
	Attempts     int        `json:"attempts"`
	HasPayload   bool       `json:"has_payload"`
	DeadLettered *time.Time `json:"dead_lettered_at"`
	RedrivenAt   *time.Time `json:"redriven_at"`
	RedrivenBy   string     `json:"redriven_by"`
}

func newDeadLetterJSON(d deadletters.Record) deadLetterJSON {
	out := deadLetterJSON{ID: d.ID, Consumer: d.Consumer, MessageID: d.MessageID, PayloadHash: d.PayloadHash.String(),
		Reason: d.Reason, Error: d.Error, Source: d.Source, Exchange: d.Exchange, RoutingKey: d.RoutingKey,
		Attempts: d.Attempts, HasPayload: d.Payload != nil, DeadLettered: at(d.At), RedrivenAt: at(d.RedrivenAt),
		RedrivenBy: d.RedrivenBy}
	if d.StoredHash != nil {
		s := d.StoredHash.String()
		out.StoredHash = &s
	}
	return out
}

// printRedrive prints what a redrive did, then a table of the messages it
// refused (the first 100) and why.
func printRedrive(e *env, o deadletters.RedriveOptions, res deadletters.RedriveResult) error {
	e.printf("moved %d of %d messages looked at from %s back to %s (%d dead-letter rows marked)",
		res.Moved, res.Scanned, dlqName(o), o.Queue, res.Marked)
	if res.Refused > 0 {
		e.printf("; %d left beyond the inbox horizon", res.Refused)
	}
	e.printf("\n")
	if len(res.Refusals) == 0 {
		return nil
	}
	t := e.table()
	t.row("REFUSED MESSAGE ID", "CONSUMER", "REASON", "WHY")
	for _, r := range res.Refusals {
		t.row(r.MessageID, r.Consumer, r.Reason, r.Err)
	}
	if more := res.Refused - len(res.Refusals); more > 0 {
		t.row(fmt.Sprintf("(%d more)", more), "", "", "")
	}
	return t.flush()
}

// redriveJSON is `idem deadletters redrive --json`.
type redriveJSON struct {
	Scanned  int           `json:"scanned"`
	Moved    int           `json:"moved"`
	Marked   int           `json:"marked"`
	Refused  int           `json:"refused"`
	Refusals []refusalJSON `json:"refusals"`
}

// refusalJSON is one message a redrive left in the dead-letter queue (the
// first 100), and why.
type refusalJSON struct {
	MessageID string `json:"message_id"`
	Consumer  string `json:"consumer"`
	Reason    string `json:"reason"`
	Error     string `json:"error"`
}

func newRedriveJSON(res deadletters.RedriveResult) redriveJSON {
	out := redriveJSON{Scanned: res.Scanned, Moved: res.Moved, Marked: res.Marked, Refused: res.Refused,
		Refusals: make([]refusalJSON, len(res.Refusals))}
	for i, r := range res.Refusals {
		out.Refusals[i] = refusalJSON{MessageID: r.MessageID, Consumer: r.Consumer, Reason: r.Reason, Error: r.Err.Error()}
	}
	return out
}
