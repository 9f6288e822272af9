package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/inbox/httpinbox"
)

const operationsUsage = `usage:
  idem operations list [--state S] [--kind K] [--tenant T] [--caller C] [--limit N] [--json]
  idem operations show OPERATION_ID [--json]
  idem operations resolve OPERATION_ID --as succeeded|failed --reason "…" [--result JSON] [--operator NAME]
      succeeded: it happened; --result is what its status shows as result
      failed:    it did not and will not; the result defaults to the problem OPERATION_FAILED
  An unknown operation, or one accepted or running whose worker is gone, can be
  resolved; one that follows a ledger effect is resolved through the ledger. One an
  operator resolved already is refused, naming who decided, when and how.`

func runOperations(ctx context.Context, e *env, args []string) error {
	return group(e, operationsUsage, args, map[string]func([]string) error{
		"list":    func(args []string) error { return operationsList(ctx, e, args) },
		"show":    func(args []string) error { return operationsShow(ctx, e, args) },
		"resolve": func(args []string) error { return operationsResolve(ctx, e, args) },
	})
}

// openOperations connects and returns the operation records and a function
// closing the pool.
func openOperations(ctx context.Context, e *env) (*httpinbox.Operations, func(), error) {
	pool, err := e.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	o, err := httpinbox.NewOperations(pool, e.tables)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return o, pool.Close, nil
}

func operationsList(ctx context.Context, e *env, args []string) error {
	fs := e.flags("operations list")
	var f httpinbox.OperationFilter
	state := fs.String("state", "", "only operations in this state ("+operationStates()+")")
	fs.StringVar(&f.Kind, "kind", "", "only operations of this kind (the Operation of the route that accepted them)")
	fs.StringVar(&f.Tenant, "tenant", "", "only operations of this tenant")
	fs.StringVar(&f.Caller, "caller", "", "only operations of this caller")
	intFlag(fs, &f.Limit, "limit", 100, 1, "list at most `N` operations, oldest first")
	e.jsonFlag(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	f.State = httpinbox.OperationState(*state)
	if f.State != "" && !f.State.Valid() {
		return fmt.Errorf("%w: --state must be one of %s", errUsage, operationStates())
	}
	o, done, err := openOperations(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	ops, err := o.List(ctx, f)
	if err != nil {
		return err
	}
	return printRows(e, ops, newOperationJSON, "OPERATION_ID\tSTATE\tTENANT\tCALLER\tKIND\tFOLLOWS\tCREATED\tUPDATED",
		func(op httpinbox.Operation) []any {
			return []any{op.ID, op.State, orDash(op.Tenant), orDash(op.Caller), op.Kind, orDash(op.Follows),
				op.CreatedAt.UTC().Format(time.RFC3339), op.UpdatedAt.UTC().Format(time.RFC3339)}
		})
}

func operationsShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("operations show")
	e.jsonFlag(fs)
	var id string
	if err := e.parse(fs, args, &id); err != nil {
		return err
	}
	o, done, err := openOperations(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	op, err := o.Get(ctx, id)
	if err != nil {
		return err
	}
	history, err := o.History(ctx, id)
	if err != nil {
		return err
	}
	if e.json {
		return e.writeJSON(newOperationDetailJSON(op, history))
	}
	t := e.table()
	t.row("operation_id", op.ID)
	t.row("state", op.State)
	t.row("kind", op.Kind)
	t.row("tenant", op.Tenant)
	t.row("caller", op.Caller)
	t.row("follows", op.Follows)
	t.row("location", op.Location)
	t.row("fields", string(op.Fields))
	if op.Result != nil {
		t.row("result", string(op.Result))
	}
	t.row("created_at", stamp(op.CreatedAt))
	t.row("updated_at", stamp(op.UpdatedAt))
	t.row("finished_at", stamp(op.FinishedAt))
	t.row("expires_at", stamp(op.ExpiresAt))
	for _, h := range history {
		t.row("resolved", fmt.Sprintf("%s by %s: %s -> %s: %s", stamp(h.At), h.Operator, h.From, h.To, h.Reason))
	}
	return t.flush()
}

func operationsResolve(ctx context.Context, e *env, args []string) error {
	fs := e.flags("operations resolve")
	as := fs.String("as", "", "succeeded (it happened) or failed (it did not, and will not)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	result := fs.String("result", "", "the operation's result, a JSON value (default: none for succeeded, the problem OPERATION_FAILED for failed)")
	operator := e.operatorFlag(fs, "who decides")
	var id string
	if err := e.parse(fs, args, &id); err != nil {
		return err
	}
	to, ok := map[string]httpinbox.OperationState{"succeeded": httpinbox.OperationSucceeded, "failed": httpinbox.OperationFailed}[*as]
	switch {
	case !ok:
		return fmt.Errorf("%w: --as must be succeeded or failed", errUsage)
	case strings.TrimSpace(*reason) == "":
		return fmt.Errorf("%w: --reason is required", errUsage)
	case *result != "" && !json.Valid([]byte(*result)):
		return fmt.Errorf("%w: --result must be a JSON value, such as '{\"chargeId\":\"ch_1\"}'", errUsage)
	}
	r := httpinbox.OperationResolution{As: to, Reason: *reason, Operator: *operator}
	if *result != "" {
		r.Result = json.RawMessage(*result)
	}
	o, done, err := openOperations(ctx, e)
	if err != nil {
		return err
	}
	defer done()
	op, err := o.Resolve(ctx, id, r)
	if err != nil {
		return err
	}
	e.printf("operation %s is now %s (audited as %s)\n", op.ID, op.State, *operator)
	return nil
}

// operationJSON is one element of `idem operations list --json`.
type operationJSON struct {
	OperationID string     `json:"operation_id"`
	State       string     `json:"state"`
	Kind        string     `json:"kind"`
	Tenant      string     `json:"tenant"`
	Caller      string     `json:"caller"`
	Follows     *string    `json:"follows"`
	Location    string     `json:"location"`
	CreatedAt   *time.Time `json:"created_at"`
	UpdatedAt   *time.Time `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
}

func newOperationJSON(op httpinbox.Operation) operationJSON {
	out := operationJSON{OperationID: op.ID, State: string(op.State), Kind: op.Kind, Tenant: op.Tenant, Caller: op.Caller,
		Location: op.Location, CreatedAt: at(op.CreatedAt), UpdatedAt: at(op.UpdatedAt), FinishedAt: at(op.FinishedAt),
		ExpiresAt: at(op.ExpiresAt)}
	if op.Follows != "" {
		out.Follows = &op.Follows
	}
	return out
}

// operationDetailJSON is `idem operations show --json`: the operation, the
// members of its status document and the operator decisions about it.
type operationDetailJSON struct {
	operationJSON
	Fields  json.RawMessage `json:"fields"`
	Result  json.RawMessage `json:"result"`
	History []historyJSON   `json:"history"`
}

func newOperationDetailJSON(op httpinbox.Operation, history []httpinbox.OperationAudit) operationDetailJSON {
	out := operationDetailJSON{operationJSON: newOperationJSON(op), Fields: op.Fields, Result: op.Result, History: []historyJSON{}}
	for _, h := range history {
		out.History = append(out.History, historyJSON{Operator: h.Operator, From: string(h.From), To: string(h.To),
			Reason: h.Reason, At: h.At.UTC()})
	}
	return out
}

// operationStates lists the states for a usage message.
func operationStates() string {
	states := httpinbox.OperationStates()
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
