package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/inbox/httpinbox"
)

func init() {
	register(command{name: "http-keys", summary: "list, show and resolve HTTP idempotency keys (and webhook events, bulk items)",
		subcommands: []string{"list", "show", "resolve"}, run: runHTTPKeys})
}

const httpKeysUsage = `usage:
  idem http-keys list [--state S] [--operation O] [--tenant T] [--caller C] [--key K] [--limit N] [--json]
  idem http-keys show KEY_ID [--json]
  idem http-keys resolve KEY_ID --as completed|retry --reason "…" [--operator NAME]
      completed: an unknown outcome happened; its stored response stays and is replayed
      retry:     hand the key back; the client's next request with the same body runs again`

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
	return printRows(e, recs, newKeyJSON, "KEY_ID\tSTATE\tTENANT\tCALLER\tOPERATION\tKEY\tSTATUS\tATTEMPTS\tCREATED",
		func(r httpinbox.KeyRecord) []any {
			return []any{r.KeyID, r.State, r.Tenant, r.Caller, r.Operation, r.Key, statusCode(r.Status), r.Attempts,
				r.CreatedAt.UTC().Format(time.RFC3339)}
		})
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
	operator := fs.String("operator", currentUser(), "who decides (default: the OS user)")
	var id string
	if err := e.parse(fs, args, &id); err != nil {
		return err
	}
	to, ok := map[string]httpinbox.KeyState{"completed": httpinbox.KeyCompleted, "retry": httpinbox.KeyStarted}[*as]
	if !ok {
		return fmt.Errorf("%w: --as must be completed or retry", errUsage)
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: --reason is required", errUsage)
	}
	k, done, err := openKeys(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	r, err := k.Resolve(ctx, id, httpinbox.KeyResolution{As: to, Reason: *reason, Operator: *operator})
	if err != nil {
		return err
	}
	e.printf("key %s is now %s (audited as %s)\n", r.KeyID, r.State, *operator)
	return nil
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
}

func newKeyJSON(r httpinbox.KeyRecord) keyJSON {
	out := keyJSON{KeyID: r.KeyID, State: string(r.State), Tenant: r.Tenant, Caller: r.Caller, Operation: r.Operation,
		IdempotencyKey: r.Key, ResourceID: r.ResourceID, Attempts: r.Attempts, LockedUntil: at(r.LockedUntil),
		CreatedAt: at(r.CreatedAt), CompletedAt: at(r.CompletedAt), ExpiresAt: at(r.ExpiresAt)}
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
	names := make([]string, len(httpinbox.KeyStates))
	for i, s := range httpinbox.KeyStates {
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
