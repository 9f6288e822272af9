package httpinbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// maxOperationIDLength bounds an operation id, in bytes.
const maxOperationIDLength = 255

// validOperationID reports whether id can name an operation, and be one
// segment of its status URL: 1 to 255 bytes of valid UTF-8 without control
// characters (C0, DEL, C1) or '/', and neither "." nor "..", which no URL
// path keeps as a segment.
func validOperationID(id string) bool {
	if id == "" || id == "." || id == ".." || len(id) > maxOperationIDLength || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if r == '/' || unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// operationIDFrom returns the id a status request names (its {id} path
// value, unescaped), and whether an operation can have it.
func operationIDFrom(r *http.Request) (string, bool) {
	id := r.PathValue("id")
	return id, validOperationID(id)
}

// Accept records the long-running operation a, in tx, the handler's
// transaction, so that it exists exactly when the request's record and
// writes commit; and returns the response to give: 202 Accepted with
// Location, Retry-After (Config.RetryAfter), the operation's id as
// resource id, and its status document as body:
//
//	{"operationId":"op_…","state":"accepted", …a.Fields}
//
// The request must carry an Idempotency-Key: the operation takes its
// scope. Accepting an existing id again, for the same scope and kind,
// answers its current status; for another, it fails with
// ErrOperationConflict.
func (m *Middleware) Accept(ctx context.Context, tx pgx.Tx, a Accepted) (Response, error) {
	c := FromContext(ctx)
	if c == nil {
		return Response{}, errors.New("httpinbox: Accept needs a request with an Idempotency-Key")
	}
	if a.ID == "" {
		a.ID = "op_" + c.KeyID()[:24]
	}
	if !validOperationID(a.ID) {
		return Response{}, fmt.Errorf("httpinbox: accept operation %q: an id is 1 to %d bytes of UTF-8 without control characters or /, not . or ..",
			a.ID, maxOperationIDLength)
	}
	if a.Location == "" {
		a.Location = "/operations/" + url.PathEscape(a.ID)
	}
	fields, err := appMembers(a.Fields, "operationId", "state", "result")
	if err != nil {
		return Response{}, err
	}
	obj := append(append([]byte{'{'}, fields...), '}')
	op, err := scanOperation(tx.QueryRow(ctx, m.ops.sql.accept, a.ID, c.tenant, c.caller, c.operation, c.id[:],
		a.Follows, a.Location, obj, c.expiry.Microseconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		op, err = scanOperation(tx.QueryRow(ctx, m.ops.sql.get, a.ID))
		if err == nil && (op.Tenant != c.tenant || op.Caller != c.caller || op.Kind != c.operation) {
			err = ErrOperationConflict
		}
	}
	if err != nil {
		return Response{}, fmt.Errorf("httpinbox: accept operation %s: %w", a.ID, err)
	}
	resp, err := m.statusResponse(op)
	resp.Status = http.StatusAccepted
	resp.Header.Set("Location", op.Location)
	return resp, err
}

// OperationStatus returns the handler of an operation's status, for a route
// whose pattern names the id {id}, such as "GET /operations/{id}". It
// answers 200 with the status document, and Retry-After while the operation
// is accepted or running:
//
//	{"operationId":"op_…","state":"succeeded", …fields, "result":{…}}
//
// Only the tenant and caller that accepted it (Config.Tenant and
// Config.Caller) see it; anyone else gets 404 OPERATION_NOT_FOUND, as for an
// id that does not exist. A followed effect's outcome is read, and stored,
// on the way. The record lives in the database, so the status survives
// restarts of every process.
func (m *Middleware) OperationStatus() http.Handler {
	return &endpoint{m: m, route: Route{Operation: "operation.status"}, expiry: m.cfg.Expiry, status: true}
}

// serveStatus answers a status request.
func (e *endpoint) serveStatus(w http.ResponseWriter, r *http.Request) {
	m := e.m
	tenant, caller, ok := e.scope(w, r)
	if !ok {
		return
	}
	id, ok := operationIDFrom(r)
	if !ok {
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusNotFound, CodeOperationNotFound, "no such operation", 0)
		return
	}
	op, err := m.ops.read(r.Context(), id)
	if errors.Is(err, ErrOperationNotFound) || (err == nil && (op.Tenant != tenant || op.Caller != caller)) {
		writeProblem(w, http.StatusNotFound, CodeOperationNotFound, "no such operation", 0)
		return
	}
	if err == nil {
		op, err = m.ops.follow(r.Context(), op)
	}
	if err != nil {
		m.log.Error("httpinbox: read operation", "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "cannot read the operation", 0)
		return
	}
	resp, err := m.statusResponse(op)
	if err != nil {
		m.log.Error("httpinbox: encode operation", "operation_id", op.ID, "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "cannot encode the operation", 0)
		return
	}
	writeResponse(w, http.StatusOK, resp.Header, "", resp.Body, false)
}

// statusResponse is op's status document, with Retry-After while it runs.
func (m *Middleware) statusResponse(op Operation) (Response, error) {
	var tail []member
	if op.Result != nil {
		tail = append(tail, member{"result", op.Result})
	}
	body, err := joinObject([]member{{"operationId", op.ID}, {"state", op.State}}, objectInside(op.Fields), tail)
	if err != nil {
		return Response{}, err
	}
	resp := Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: body, ResourceID: op.ID}
	if op.State == OperationAccepted || op.State == OperationRunning {
		resp.Header.Set("Retry-After", strconv.Itoa(retryAfter(m.cfg.RetryAfter)))
	}
	return resp, nil
}
