package console

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// The HTTP screen lists the idempotency keys and the long-running
// operations that wait (in progress, or of unknown outcome), through
// httpinbox's operator functions, and resolves them through them: each
// decision is audited in their audit tables.

// httpListLimit is how many keys or operations of one state the screen
// shows, oldest first.
const httpListLimit = 50

// keyList is the keys of one state.
type keyList struct {
	State httpinbox.KeyState
	Keys  []httpinbox.KeyRecord
}

// operationList is the operations of one state.
type operationList struct {
	State      httpinbox.OperationState
	Operations []httpinbox.Operation
}

// httpData is the HTTP screen.
type httpData struct {
	Keys       []keyList
	Operations []operationList
	Limit      int
}

// httpEdge lists the keys started or unknown, and the operations accepted,
// running or unknown (httpinbox's Keys.List and Operations.List).
func (c *Console) httpEdge(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	d := httpData{Limit: httpListLimit}
	for _, st := range []httpinbox.KeyState{httpinbox.KeyUnknown, httpinbox.KeyStarted} {
		keys, err := c.store.keys.List(ctx, httpinbox.KeyFilter{State: st, Limit: httpListLimit})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Keys = append(d.Keys, keyList{State: st, Keys: keys})
	}
	for _, st := range []httpinbox.OperationState{httpinbox.OperationUnknown, httpinbox.OperationAccepted, httpinbox.OperationRunning} {
		ops, err := c.store.ops.List(ctx, httpinbox.OperationFilter{State: st, Limit: httpListLimit})
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Operations = append(d.Operations, operationList{State: st, Operations: ops})
	}
	c.render(w, r, s, http.StatusOK, "http", "HTTP edge", d)
}

// httpKeyData is a key's page.
type httpKeyData struct {
	Key      httpinbox.KeyRecord
	History  []httpinbox.KeyAudit
	Revealed bool
}

// httpKey shows one key (Keys.Get, Keys.History); its stored body only
// when asked and allowed.
func (c *Console) httpKey(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id := r.URL.Query().Get("id")
	k, err := c.store.keys.Get(ctx, id)
	if errors.Is(err, httpinbox.ErrKeyNotFound) {
		c.refuse(w, r, http.StatusNotFound, "no such idempotency key")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	h, err := c.store.keys.History(ctx, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := httpKeyData{Key: k, History: h}
	if c.cfg.ShowPayloads && r.URL.Query().Get("payload") == "1" {
		d.Revealed = true
		c.cfg.Logger.Info("console: stored body shown", "operator", s.operator, "key", id)
	} else {
		d.Key.Body, d.Key.Header = nil, nil
	}
	c.render(w, r, s, http.StatusOK, "httpkey", "Idempotency key", d)
}

// resolveKey resolves keys (Keys.Resolve, audited): completed or retry.
func (c *Console) resolveKey(w http.ResponseWriter, r *http.Request, s *session) {
	as, ok := map[string]httpinbox.KeyState{"completed": httpinbox.KeyCompleted, "retry": httpinbox.KeyStarted}[r.PostForm.Get("as")]
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "resolve a key as completed or retry")
		return
	}
	c.resolveEach(w, r, s, "Resolve keys as "+r.PostForm.Get("as"), "/http", func(ctx context.Context, id, reason string) (string, error) {
		k, err := c.store.keys.Resolve(ctx, id, httpinbox.KeyResolution{As: as, Reason: reason, Operator: s.operator})
		return string(k.State), err
	}, httpinbox.ErrKeyNotResolvable, httpinbox.ErrKeyInFlight, httpinbox.ErrKeyNotFound)
}

// httpOperationData is an operation's page.
type httpOperationData struct {
	Operation httpinbox.Operation
	History   []httpinbox.OperationAudit
	Revealed  bool
}

// httpOperation shows one operation (Operations.Get, Operations.History);
// its fields and result only when asked and allowed.
func (c *Console) httpOperation(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id := r.URL.Query().Get("id")
	op, err := c.store.ops.Get(ctx, id)
	if errors.Is(err, httpinbox.ErrOperationNotFound) {
		c.refuse(w, r, http.StatusNotFound, "no such operation")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	h, err := c.store.ops.History(ctx, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := httpOperationData{Operation: op, History: h}
	if c.cfg.ShowPayloads && r.URL.Query().Get("payload") == "1" {
		d.Revealed = true
	} else {
		d.Operation.Fields, d.Operation.Result = nil, nil
	}
	c.render(w, r, s, http.StatusOK, "httpoperation", "Operation", d)
}

// resolveOperation resolves operations (Operations.Resolve, audited):
// succeeded or failed.
func (c *Console) resolveOperation(w http.ResponseWriter, r *http.Request, s *session) {
	as, ok := map[string]httpinbox.OperationState{"succeeded": httpinbox.OperationSucceeded,
		"failed": httpinbox.OperationFailed}[r.PostForm.Get("as")]
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "resolve an operation as succeeded or failed")
		return
	}
	c.resolveEach(w, r, s, "Resolve operations as "+r.PostForm.Get("as"), "/http", func(ctx context.Context, id, reason string) (string, error) {
		op, err := c.store.ops.Resolve(ctx, id, httpinbox.OperationResolution{As: as, Reason: reason, Operator: s.operator})
		return string(op.State), err
	}, httpinbox.ErrOperationNotFound, httpinbox.ErrOperationInFlight, httpinbox.ErrOperationResolved, httpinbox.ErrOperationState)
}

// resolveEach runs resolve for each selected id with the form's reason,
// and reports each: done, refused (an error matching one of refusals) or
// failed.
func (c *Console) resolveEach(w http.ResponseWriter, r *http.Request, s *session, action, back string,
	resolve func(ctx context.Context, id, reason string) (string, error), refusals ...error) {
	reason, ok := reasonOf(r)
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "a resolution needs a reason, for the audit trail")
		return
	}
	ids := r.PostForm["id"]
	if len(ids) == 0 {
		c.refuse(w, r, http.StatusBadRequest, "select what to resolve")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ActionTimeout)
	defer cancel()
	var lines []actionLine
	for _, id := range ids {
		state, err := resolve(ctx, id, reason)
		l := actionLine{What: show(id)}
		switch {
		case err == nil:
			l.OK, l.Outcome = true, "now "+state+", audited as "+show(s.operator)
		case matchesAny(err, refusals):
			l.Refused, l.Outcome = true, "refused: "+err.Error()
		default:
			l.Outcome = "failed: " + err.Error()
		}
		lines = append(lines, l)
	}
	c.reportAction(w, r, s, actionsData{Action: action, Reason: reason, Lines: lines, Back: back})
}

func matchesAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
