package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/safetext"
)

func init() {
	register(command{name: "deadletters", summary: "list dead letters, or move them back to their queue",
		subcommands: []string{"list", "redrive"}, run: runDeadLetters})
}

const deadLettersUsage = `usage:
  idem deadletters list [--consumer C] [--id ID] [--reason R] [--limit N] [--json]
  idem deadletters redrive --queue Q [--reason R] [--id ID] [--consumer C] [--limit N] [--operator NAME]
                          [--allow-beyond-horizon] [--json]
      moves matching messages from Q.dlq back to Q (broker: --amqp-url, else IDEM_AMQP_URL)`

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
	rows, err := deadletters.List(ctx, pool, e.tables, f)
	if err != nil {
		return err
	}
	return printRows(e, rows, newDeadLetterJSON,
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
}

func deadLettersRedrive(ctx context.Context, e *env, args []string) error {
	fs := e.flags("deadletters redrive")
	var o deadletters.RedriveOptions
	fs.StringVar(&o.Queue, "queue", "", "the queue to move messages back to (required); they are taken from its dead-letter queue")
	fs.StringVar(&o.DeadLetterQueue, "dlq", "", "the dead-letter queue (default: QUEUE.dlq)")
	fs.StringVar(&o.Reason, "reason", "", "only messages dead-lettered for this reason")
	fs.StringVar(&o.MessageID, "id", "", "only the message with this message id")
	fs.StringVar(&o.Consumer, "consumer", "", "only messages this consumer dead-lettered")
	intFlag(fs, &o.Limit, "limit", 0, 0, "move at most `N` messages (default: every matching one)")
	fs.StringVar(&o.Operator, "operator", currentUser(), "who redrives, recorded on each dead-letter row")
	fs.BoolVar(&o.AllowBeyondHorizon, "allow-beyond-horizon", false,
		"also move messages that entered the dead-letter queue before the consumer's inbox horizon: they will be applied as new")
	amqpURL := fs.String("amqp-url", "", "RabbitMQ URL, or a cluster's node URLs separated by commas (default: $IDEM_AMQP_URL)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
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
		if jerr := e.writeJSON(redriveJSON{Scanned: res.Scanned, Moved: res.Moved, Marked: res.Marked, Refused: res.Refused}); jerr != nil {
			return errors.Join(err, jerr)
		}
	} else if err == nil || res.Scanned > 0 {
		e.printf("moved %d of %d messages looked at from %s back to %s (%d dead-letter rows marked)",
			res.Moved, res.Scanned, dlqName(o), o.Queue, res.Marked)
		if res.Refused > 0 {
			e.printf("; %d left beyond the inbox horizon", res.Refused)
		}
		e.printf("\n")
	}
	if err != nil {
		return fmt.Errorf("%w; what was not moved is still in %s", err, dlqName(o))
	}
	return nil
}

func dlqName(o deadletters.RedriveOptions) string {
	if o.DeadLetterQueue != "" {
		return o.DeadLetterQueue
	}
	return o.Queue + ".dlq"
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

// redriveJSON is `idem deadletters redrive --json`.
type redriveJSON struct {
	Scanned int `json:"scanned"`
	Moved   int `json:"moved"`
	Marked  int `json:"marked"`
	Refused int `json:"refused"`
}
