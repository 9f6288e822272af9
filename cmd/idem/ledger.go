package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/safetext"
	"github.com/idemkit/idem/ledger"
)

const ledgerUsage = `usage:
  idem ledger list [--status S] [--type T] [--consumer C] [--limit N] [--after CURSOR] [--json]
  idem ledger show ID [--json]
  idem ledger resolve ID... --as succeeded|failed|retry --reason "…" [--status S] [--operator NAME] [--json]
  idem ledger resolve --status S --all [--type T] [--consumer C] --as succeeded|failed|retry --reason "…" [--operator NAME] [--json]
      each effect in a transaction of its own, with its own audit row; one that moved on (in flight,
      succeeded, no longer in --status) is refused, and the command exits 1 when any was
  idem ledger stats [--json]`

func runLedger(ctx context.Context, e *env, args []string) error {
	return group(e, ledgerUsage, args, map[string]func([]string) error{
		"list":    func(args []string) error { return ledgerList(ctx, e, args) },
		"show":    func(args []string) error { return ledgerShow(ctx, e, args) },
		"resolve": func(args []string) error { return ledgerResolve(ctx, e, args) },
		"stats":   func(args []string) error { return ledgerStats(ctx, e, args) },
	})
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
	var f ledger.Filter
	st := fs.String("status", "", "only effects in this status (pending, in_flight, succeeded, failed_retryable, failed_terminal, unknown, suppressed)")
	fs.StringVar(&f.Type, "type", "", "only effects of this type")
	fs.StringVar(&f.Consumer, "consumer", "", "only effects this consumer recorded")
	fs.StringVar(&f.After, "after", "", "the page after this `CURSOR` (printed under a full page)")
	intFlag(fs, &f.Limit, "limit", 100, 1, "list at most `N` effects, oldest first")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *st != "" && !ledger.Status(*st).Valid() {
		return fmt.Errorf("%w: --status %q is not one of %v", errUsage, *st, ledger.Statuses())
	}
	f.Status = ledger.Status(*st)
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	entries, err := l.List(ctx, f)
	if err != nil {
		return err
	}
	err = printRows(e, entries, newEntryJSON, "EFFECT_ID\tTYPE\tSTATUS\tBUSINESS_KEY\tIDEMPOTENCY_KEY\tATTEMPTS\tCREATED\tLAST_ERROR",
		func(en ledger.Entry) []any {
			return []any{en.ID, en.Type, en.Status, oneLine(en.BusinessKey, 60), en.IdempotencyKey, en.AttemptCount,
				en.CreatedAt.UTC().Format(time.RFC3339), oneLine(en.LastError, 60)}
		})
	if err == nil && len(entries) == f.Limit {
		e.nextPage("--after " + entries[len(entries)-1].Cursor())
	}
	return err
}

func ledgerShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger show")
	e.jsonFlag(fs)
	var id string
	if err := e.parse(fs, args, &id); err != nil {
		return err
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	en, err := l.Get(ctx, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return showTombstone(ctx, e, l, id, err)
	}
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
	t := e.table()
	t.row("effect_id", en.ID)
	t.row("effect_type", en.Type)
	t.row("status", en.Status)
	t.row("business_key", en.BusinessKey)
	t.row("target", en.Target)
	t.row("consumer", en.Consumer)
	t.row("message_id", en.MessageID)
	t.row("idempotency_key", en.IdempotencyKey)
	t.row("attempt_count", en.AttemptCount)
	t.row("next_attempt_at", stamp(en.NextAttemptAt))
	t.row("locked_until", stamp(en.LockedUntil))
	t.row("lock_owner", en.LockOwner)
	t.row("last_error", oneLine(en.LastError, 200))
	t.row("created_at", stamp(en.CreatedAt))
	t.row("completed_at", stamp(en.CompletedAt))
	t.row("request_hash", en.RequestHash)
	t.row("request", printable(en.Request))
	if !en.ResponseHash.IsZero() {
		t.row("response_hash", en.ResponseHash)
		t.row("response", printable(en.Response))
	}
	for _, h := range history {
		t.row("resolved", fmt.Sprintf("%s by %s: %s -> %s: %s", stamp(h.At), h.Operator, h.From, h.To, h.Reason))
	}
	return t.flush()
}

func ledgerResolve(ctx context.Context, e *env, args []string) error {
	fs := e.flags("ledger resolve")
	as := fs.String("as", "", "succeeded (it happened), failed (it did not; never try again) or retry (send again, same idempotency key)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	operator := e.operatorFlag(fs, "who decides")
	st := fs.String("status", "", "with --all, the status of the effects to resolve; with IDs, the status each must still be in")
	all := fs.Bool("all", false, "resolve every effect in --status (narrowed by --type, --consumer) recorded before the command started")
	var f ledger.Filter
	fs.StringVar(&f.Type, "type", "", "with --all: only effects of this type")
	fs.StringVar(&f.Consumer, "consumer", "", "with --all: only effects this consumer recorded")
	e.jsonFlag(fs)
	ids, err := e.parseArgs(fs, args)
	if err != nil {
		return err
	}
	to, ok := map[string]ledger.Status{
		"succeeded": ledger.StatusSucceeded,
		"failed":    ledger.StatusFailedTerminal,
		"retry":     ledger.StatusPending,
	}[*as]
	switch {
	case !ok:
		return fmt.Errorf("%w: --as must be succeeded, failed or retry", errUsage)
	case strings.TrimSpace(*reason) == "":
		return fmt.Errorf("%w: --reason is required", errUsage)
	case *st != "" && !ledger.Status(*st).Valid():
		return fmt.Errorf("%w: --status %q is not one of %v", errUsage, *st, ledger.Statuses())
	}
	if err := newSelection(fs, ids, *all, *st, "type", "consumer").check("--status", "effect"); err != nil {
		return err
	}
	l, done, err := openLedger(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	out := e.resolveOutput("effect", *operator, *all)
	var failed error
	report := func(res ledger.ResolveResult) {
		if err := out.add(res.ID, string(res.Entry.Status), res.Err, "ledger: resolve "+res.ID+": ", newResolvedEffectJSON(res)); err != nil {
			failed = err
		}
	}
	r := ledger.Resolution{As: to, Reason: *reason, Operator: *operator}
	if *all {
		f.Status = ledger.Status(*st)
		err = l.ResolveWhere(ctx, f, r, report)
	} else {
		r.From = ledger.Status(*st)
		var results []ledger.ResolveResult
		results, err = l.ResolveMany(ctx, ids, r)
		for _, res := range results {
			report(res)
		}
	}
	return out.close(errors.Join(err, failed))
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
		counts := make(map[string]int64, len(s.Counts))
		estimated := []string{}
		for _, st := range ledger.Statuses() {
			counts[string(st)] = s.Counts[st]
			if s.Estimated[st] {
				estimated = append(estimated, string(st))
			}
		}
		return e.writeJSON(ledgerStatsJSON{Counts: counts, Estimated: estimated, OldestDueSeconds: s.OldestDue.Seconds()})
	}
	t := e.table()
	for _, st := range ledger.Statuses() {
		t.row(st, approx(s.Counts[st], s.Estimated[st]))
	}
	t.row("oldest_due_age", s.OldestDue.Round(time.Millisecond))
	return t.flush()
}

// showTombstone prints what the ledger keeps of an effect retention
// removed, or notFound when it keeps nothing.
func showTombstone(ctx context.Context, e *env, l *ledger.Ledger, id string, notFound error) error {
	ts, err := l.Tombstone(ctx, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFound
	}
	if err != nil {
		return err
	}
	if e.json {
		return e.writeJSON(map[string]any{"effect_id": ts.ID, "idempotency_key": ts.IdempotencyKey, "status": ts.Status,
			"settled_at": ts.SettledAt, "deleted_at": ts.DeletedAt, "tombstone": true})
	}
	t := e.table()
	t.row("effect_id", ts.ID)
	t.row("status", fmt.Sprintf("%s (retention removed the effect; this is its tombstone)", ts.Status))
	t.row("idempotency_key", ts.IdempotencyKey)
	t.row("settled_at", stamp(ts.SettledAt))
	t.row("deleted_at", stamp(ts.DeletedAt))
	t.row("recorded_again", "suppressed, never sent")
	return t.flush()
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
	return safetext.Abbreviate(strings.Join(strings.Fields(s), " "), n)
}

// printable shows b as text when it is, and as hex otherwise.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return fmt.Sprintf("%x", b)
}
