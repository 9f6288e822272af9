package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/deadletters"
)

func init() {
	register(command{name: "deadletters", summary: "list dead letters: reason, error, original route", run: runDeadLetters})
}

func runDeadLetters(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "list" {
		return fmt.Errorf("%w: idem deadletters list [--consumer C] [--id ID] [--reason R] [--limit N]", errUsage)
	}
	fs := e.flags("deadletters list")
	var f deadletters.Filter
	fs.StringVar(&f.Consumer, "consumer", "", "only this consumer")
	fs.StringVar(&f.MessageID, "id", "", "only this message id")
	fs.StringVar(&f.Reason, "reason", "", "only this reason (payload_conflict, max_attempts, …)")
	fs.IntVar(&f.Limit, "limit", 50, "newest N")
	if err := fs.Parse(args[1:]); err != nil {
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
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tAT\tCONSUMER\tMESSAGE ID\tREASON\tATTEMPTS\tSOURCE\tPAYLOAD HASH\tERROR")
	for _, d := range rows {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.At.UTC().Format(time.RFC3339), d.Consumer,
			d.MessageID, d.Reason, d.Attempts, d.Source, d.PayloadHash.Short(), truncate(d.Error, 80))
	}
	return w.Flush()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
