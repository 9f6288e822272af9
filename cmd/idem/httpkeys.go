package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/inbox/httpinbox"
)

const httpKeysUsage = `usage:
  idem http-keys list [--state S] [--operation O] [--tenant T] [--caller C] [--key K] [--limit N] [--after CURSOR] [--json]
  idem http-keys show KEY_ID [--json]
  idem http-keys resolve KEY_ID... --as completed|retry --reason "…" [--state S] [--operator NAME] [--json]
  idem http-keys resolve --state S --all [--operation O] [--tenant T] [--caller C] --as completed|retry --reason "…" [--operator NAME] [--json]
      completed: an unknown outcome happened; its stored response stays and is replayed
      retry:     hand the key back; the client's next request with the same body runs again
  Each key in a transaction of its own, with its own audit row. A key another operator resolved
  meanwhile is refused, naming who decided, when and how; so is one that moved on (a request holds
  it, no longer in --state). The command exits 1 when any key was refused. --status is --state.`

func runHTTPKeys(ctx context.Context, e *env, args []string) error {
	return group(e, httpKeysUsage, args, map[string]func([]string) error{
		"list":    func(args []string) error { return httpKeysList(ctx, e, args) },
		"show":    func(args []string) error { return httpKeysShow(ctx, e, args) },
		"resolve": func(args []string) error { return httpKeysResolve(ctx, e, args) },
	})
}

// openKeys connects and returns the operator functions and a function
// closing the pool.
func openKeys(ctx context.Context, e *env) (*httpinbox.Keys, func(), error) {
	pool, err := e.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	k, err := httpinbox.NewKeys(pool, e.tables)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return k, pool.Close, nil
}

func httpKeysList(ctx context.Context, e *env, args []string) error {
	fs := e.flags("http-keys list")
	var f httpinbox.KeyFilter
	state := fs.String("state", "", "only keys in this state (started, completed, failed_replayable, unknown)")
	fs.StringVar(&f.Operation, "operation", "", "only keys of this operation (a route's Operation, webhook:PROVIDER, a bulk's item operation)")
	fs.StringVar(&f.Tenant, "tenant", "", "only keys of this tenant")
	fs.StringVar(&f.Caller, "caller", "", "only keys of this caller (a webhook's provider)")
	fs.StringVar(&f.Key, "key", "", "only this Idempotency-Key (event id, item key) as the client sent it")
	fs.IntVar(&f.Limit, "limit", 100, "most keys to list, oldest first")
	fs.StringVar(&f.After, "after", "", "the page after this `CURSOR` (printed under a full page)")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	f.State = httpinbox.KeyState(*state)
	switch {
	case f.State != "" && !f.State.Valid():
		return fmt.Errorf("%w: --state must be one of %s", errUsage, keyStates())
	case f.Limit < 1:
		return fmt.Errorf("%w: --limit must be at least 1", errUsage)
	}
	k, done, err := openKeys(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	recs, err := k.List(ctx, f)
	if err != nil {
		return err
	}
	err = printRows(e, recs, newKeyJSON, "KEY_ID\tSTATE\tTENANT\tCALLER\tOPERATION\tKEY\tSTATUS\tATTEMPTS\tCREATED",
		func(r httpinbox.KeyRecord) []any {
			return []any{r.KeyID, r.State, r.Tenant, r.Caller, r.Operation, r.Key, statusCode(r.Status), r.Attempts,
				r.CreatedAt.UTC().Format(time.RFC3339)}
		})
	if err == nil && len(recs) == f.Limit {
		e.nextPage("--after " + recs[len(recs)-1].Cursor())
	}
	return err
}

func httpKeysShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("http-keys show")
	e.jsonFlag(fs)
	var id string
	if err := e.parse(fs, args, &id); err != nil {
		return err
	}
	k, done, err := openKeys(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	r, err := k.Get(ctx, id)
	if err != nil {
		return err
	}
	history, err := k.History(ctx, id)
	if err != nil {
		return err
	}
	if e.json {
		return e.writeJSON(newKeyDetailJSON(r, history))
	}
	t := e.table()
	t.row("key_id", r.KeyID)
	t.row("state", r.State)
	t.row("tenant", r.Tenant)
	t.row("caller", r.Caller)
	t.row("operation", r.Operation)
	t.row("idempotency_key", r.Key)
	t.row("fingerprint", r.Fingerprint)
	t.row("attempts", r.Attempts)
	t.row("lock_owner", r.LockOwner)
	t.row("locked_until", stamp(r.LockedUntil))
	t.row("created_at", stamp(r.CreatedAt))
	t.row("completed_at", stamp(r.CompletedAt))
	t.row("expires_at", stamp(r.ExpiresAt))
	t.row("forget_at", stamp(r.ForgetAt))
	t.row("status_code", statusCode(r.Status))
	for _, name := range slices.Sorted(maps.Keys(r.Header)) {
		t.row("header", name+": "+strings.Join(r.Header[name], ", "))
	}
	t.row("resource_id", r.ResourceID)
	switch {
	case r.BodyOmitted:
		t.row("body", "(not stored)")
	case r.Body != nil:
		t.row("body", printable(r.Body))
	}
	for _, h := range history {
		t.row("resolved", fmt.Sprintf("%s by %s: %s -> %s: %s", stamp(h.At), h.Operator, h.From, h.To, h.Reason))
	}
	return t.flush()
}

func httpKeysResolve(ctx context.Context, e *env, args []string) error {
	fs := e.flags("http-keys resolve")
	as := fs.String("as", "", "completed (an unknown outcome happened) or retry (the key runs again on its next request)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	operator := e.operatorFlag(fs, "who decides")
	var state string
	fs.StringVar(&state, "state", "", "with --all, the state of the keys to resolve; with KEY_IDs, the state each must still be in")
	fs.StringVar(&state, "status", "", "the same as --state")
	all := fs.Bool("all", false, "resolve every key in --state (narrowed by --operation, --tenant, --caller) created before the command started")
	var f httpinbox.KeyFilter
	fs.StringVar(&f.Operation, "operation", "", "with --all: only keys of this operation")
	fs.StringVar(&f.Tenant, "tenant", "", "with --all: only keys of this tenant")
	fs.StringVar(&f.Caller, "caller", "", "with --all: only keys of this caller")
	e.jsonFlag(fs)
	ids, err := e.parseArgs(fs, args)
	if err != nil {
		return err
	}
	to, ok := map[string]httpinbox.KeyState{"completed": httpinbox.KeyCompleted, "retry": httpinbox.KeyStarted}[*as]
	switch {
	case !ok:
		return fmt.Errorf("%w: --as must be completed or retry", errUsage)
	case strings.TrimSpace(*reason) == "":
		return fmt.Errorf("%w: --reason is required", errUsage)
	case state != "" && !httpinbox.KeyState(state).Valid():
		return fmt.Errorf("%w: --state must be one of %s", errUsage, keyStates())
	}
	if err := newSelection(fs, ids, *all, state, "operation", "tenant", "caller").check("--state", "key"); err != nil {
		return err
	}
	k, done, err := openKeys(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	out := e.resolveOutput("key", *operator, *all)
	var failed error
	report := func(res httpinbox.KeyResolveResult) {
		if err := out.add(res.KeyID, string(res.Record.State), res.Err, "httpinbox: resolve key "+res.KeyID+": ",
			newResolvedKeyJSON(res)); err != nil {
			failed = err
		}
	}
	r := httpinbox.KeyResolution{As: to, Reason: *reason, Operator: *operator}
	if *all {
		f.State = httpinbox.KeyState(state)
		err = k.ResolveWhere(ctx, f, r, report)
	} else {
		r.From = httpinbox.KeyState(state)
		var results []httpinbox.KeyResolveResult
		results, err = k.ResolveMany(ctx, ids, r)
		for _, res := range results {
			report(res)
		}
	}
	return out.close(errors.Join(err, failed))
}

// resolvedKeyJSON is one element of `idem http-keys resolve --json`: what
// became of one key.
type resolvedKeyJSON struct {
	KeyID    string `json:"key_id"`
	Resolved bool   `json:"resolved"`
	// From is the state the key was in; null when it was not found.
	From *string `json:"from"`
	// State is the state it is in now; null when it was not found.
	State *string `json:"state"`
	// Error says why it was refused; null when it was resolved.
	Error *string `json:"error"`
}

func newResolvedKeyJSON(r httpinbox.KeyResolveResult) resolvedKeyJSON {
	now := string(r.From)
	if r.Resolved() {
		now = string(r.Record.State)
	}
	return resolvedKeyJSON{KeyID: r.KeyID, Resolved: r.Resolved(), From: jsonText(string(r.From)), State: jsonText(now),
		Error: errText(r.Err)}
}

// keyJSON is one element of `idem http-keys list --json`.
type keyJSON struct {
	KeyID          string     `json:"key_id"`
	State          string     `json:"state"`
	Tenant         string     `json:"tenant"`
	Caller         string     `json:"caller"`
	Operation      string     `json:"operation"`
	IdempotencyKey string     `json:"idempotency_key"`
	StatusCode     *int       `json:"status_code"`
	ResourceID     string     `json:"resource_id"`
	Attempts       int        `json:"attempts"`
	LockedUntil    *time.Time `json:"locked_until"`
	CreatedAt      *time.Time `json:"created_at"`
	CompletedAt    *time.Time `json:"completed_at"`
	ExpiresAt      *time.Time `json:"expires_at"`
	ForgetAt       *time.Time `json:"forget_at"`
}

func newKeyJSON(r httpinbox.KeyRecord) keyJSON {
	out := keyJSON{KeyID: r.KeyID, State: string(r.State), Tenant: r.Tenant, Caller: r.Caller, Operation: r.Operation,
		IdempotencyKey: r.Key, ResourceID: r.ResourceID, Attempts: r.Attempts, LockedUntil: at(r.LockedUntil),
		CreatedAt: at(r.CreatedAt), CompletedAt: at(r.CompletedAt), ExpiresAt: at(r.ExpiresAt), ForgetAt: at(r.ForgetAt)}
	if r.Status != 0 {
		out.StatusCode = &r.Status
	}
	return out
}

// keyDetailJSON is `idem http-keys show --json`: the record, its stored
// response and the operator decisions about it.
type keyDetailJSON struct {
	keyJSON
	Fingerprint string        `json:"fingerprint"`
	LockOwner   string        `json:"lock_owner"`
	Headers     http.Header   `json:"headers"`
	Body        *string       `json:"body"`
	BodyOmitted bool          `json:"body_omitted"`
	History     []historyJSON `json:"history"`
}

func newKeyDetailJSON(r httpinbox.KeyRecord, history []httpinbox.KeyAudit) keyDetailJSON {
	out := keyDetailJSON{keyJSON: newKeyJSON(r), Fingerprint: r.Fingerprint.String(), LockOwner: r.LockOwner,
		Headers: r.Header, Body: text(r.Body), BodyOmitted: r.BodyOmitted, History: []historyJSON{}}
	for _, h := range history {
		out.History = append(out.History, historyJSON{Operator: h.Operator, From: string(h.From), To: string(h.To),
			Reason: h.Reason, At: h.At.UTC()})
	}
	return out
}

// keyStates lists the states for a usage message.
func keyStates() string {
	states := httpinbox.KeyStates()
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

func statusCode(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}
