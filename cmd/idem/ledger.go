package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/ledger"
)

func init() {
	register(command{name: "ledger", summary: "list, show, resolve and count side effects",
		subcommands: []string{"list", "show", "resolve", "stats"}, run: runLedger})
}

const ledgerUsage = `usage:
  idem ledger list [--status S] [--type T] [--limit N] [--json]
  idem ledger show ID [--json]
  idem ledger resolve ID --as succeeded|failed|retry --reason "…" [--operator NAME]
  idem ledger stats [--json]`

func runLedger(ctx context.Context, e *env, args []string) error {
	return group(e, ledgerUsage, args, map[string]func([]string) error{
		"list":    func(args []string) error { return ledgerList(ctx, e, args) },
		"show":    func(args []string) error { return ledgerShow(ctx, e, args) },
		"resolve": func(args []string) error { return ledgerResolve(ctx, e, args) },
		"stats":   func(args []string) error { return ledgerStats(ctx, e, args) },
	})
}

// parseWithID parses flags that may come before or after one positional ID.
func parseWithID(e *env, fs *flag.FlagSet, args []string) (string, error) {
	if err := e.parse(fs, args); err != nil {
		return "", err
	}
	if fs.NArg() == 0 {
		return "", fmt.Errorf("%w: missing ID", errUsage)
	}
	id := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return "", err
	}
	if fs.NArg() > 0 {
		return "", fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return id, nil
}

// openLedger connects and returns the ledger and a function closing the pool.
func openLedger(ctx context.Context, e *env) (*ledger.Ledger, func(), error) {
	pool, err := e.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: e.tables})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return l, pool.Close, nil
}

func ledgerList(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger list")
	st := fs.String("status", "", "only effects in this status (pending, in_flight, succeeded, failed_retryable, failed_terminal, unknown, suppressed)")
	typ := fs.String("type", "", "only effects of this type")
	limit := fs.Int("limit", 100, "most effects to list")
	e.jsonFlag(fs)
	if err := e.parseNoArgs(fs, args); err != nil {
		return err
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	entries, err := l.List(ctx, ledger.Filter{Status: ledger.Status(*st), Type: *typ, Limit: *limit})
	if err != nil {
		return err
	}
	return printRows(e, entries, newEntryJSON, "EFFECT_ID\tTYPE\tSTATUS\tATTEMPTS\tCREATED\tLAST_ERROR",
		func(en ledger.Entry) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s", en.ID, en.Type, en.Status, en.AttemptCount,
				en.CreatedAt.UTC().Format(time.RFC3339), oneLine(en.LastError, 60))
		})
}

func ledgerShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger show")
	e.jsonFlag(fs)
	id, err := parseWithID(e, fs, args)
	if err != nil {
		return err
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	en, err := l.Get(ctx, id)
	if err != nil {
		return err
	}
	history, err := l.History(ctx, id)
	if err != nil {
		return err
	}
	if e.json {
		return e.writeJSON(newEffectJSON(en, history))
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, v) }
	row("effect_id", en.ID)
	row("effect_type", en.Type)
	row("status", string(en.Status))
	row("business_key", en.BusinessKey)
	row("target", en.Target)
	row("consumer", en.Consumer)
	row("message_id", en.MessageID)
	row("idempotency_key", en.IdempotencyKey)
	row("attempt_count", fmt.Sprint(en.AttemptCount))
	row("next_attempt_at", stamp(en.NextAttemptAt))
	row("locked_until", stamp(en.LockedUntil))
	row("lock_owner", en.LockOwner)
	row("last_error", oneLine(en.LastError, 200))
	row("created_at", stamp(en.CreatedAt))
	row("completed_at", stamp(en.CompletedAt))
	row("request_hash", en.RequestHash.String())
	row("request", printable(en.Request))
	if !en.ResponseHash.IsZero() {
		row("response_hash", en.ResponseHash.String())
		row("response", printable(en.Response))
	}
	for _, h := range history {
		row("resolved", fmt.Sprintf("%s by %s: %s -> %s: %s", stamp(h.At), h.Operator, h.From, h.To, h.Reason))
	}
	return w.Flush()
}

func ledgerResolve(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger resolve")
	as := fs.String("as", "", "succeeded (it happened), failed (it did not; never try again) or retry (send again, same idempotency key)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	operator := fs.String("operator", currentUser(), "who decides (default: the OS user)")
	id, err := parseWithID(e, fs, args)
	if err != nil {
		return err
	}
	to, ok := map[string]ledger.Status{
		"succeeded": ledger.StatusSucceeded,
		"failed":    ledger.StatusFailedTerminal,
		"retry":     ledger.StatusPending,
	}[*as]
	if !ok {
		return fmt.Errorf("%w: --as must be succeeded, failed or retry", errUsage)
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: --reason is required", errUsage)
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	en, err := l.Resolve(ctx, id, ledger.Resolution{As: to, Reason: *reason, Operator: *operator})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "effect %s is now %s (audited as %s)\n", en.ID, en.Status, *operator)
	return nil
}

func ledgerStats(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger stats")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	s, err := l.Stats(ctx)
	if err != nil {
		return err
	}
	if e.json {
		counts := make(map[string]int64, len(ledger.Statuses))
		for _, st := range ledger.Statuses {
			counts[string(st)] = s.Counts[st]
		}
		return e.writeJSON(ledgerStatsJSON{Counts: counts, OldestDueSeconds: s.OldestDue.Seconds()})
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for _, st := range ledger.Statuses {
		fmt.Fprintf(w, "%s\t%d\n", st, s.Counts[st])
	}
	fmt.Fprintf(w, "oldest_due_age\t%s\n", s.OldestDue.Round(time.Millisecond))
	return w.Flush()
}

func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// printable shows b as text when it is, and as hex otherwise.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return fmt.Sprintf("%x", b)
}
