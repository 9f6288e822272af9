package httpinbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// DefaultMaxBulkItems bounds the items of one bulk request when
// Bulk.MaxItems is 0.
const DefaultMaxBulkItems = 100

// MaxBulkItems is the largest Bulk.MaxItems: every item of a request is
// claimed, run and answered in one transaction and one stored response.
const MaxBulkItems = 1000

// ItemKeyMember is the member of each bulk item that carries its key.
const ItemKeyMember = "itemKey"

// CodeTooManyItems (413) answers a bulk request with more items than
// Bulk.MaxItems.
const CodeTooManyItems = "TOO_MANY_BULK_ITEMS"

// Bulk describes an endpoint that takes many items in one request, such as
// POST /captures:bulk. The request carries an Idempotency-Key for the
// operation, as any route does, and a body {"items":[…]} whose every item is
// a JSON object with a key of its own in ItemKeyMember ("itemKey"):
//
//	{"items":[{"itemKey":"c-1","orderId":"o-1","amount":1234},{"itemKey":"c-2",…}]}
//
// The answer is 200 when every item is accepted or already accepted, else
// 207, with one result per item, in the request's order:
//
//	{"items":[{"itemKey":"c-1","status":"accepted",…},{"itemKey":"c-2","status":"rejected","problem":{…}}]}
//
// The whole request runs in one transaction, each item under a savepoint of
// its own; the operation's record stores the whole answer, and each
// accepted item's key gets a record of its own with the item's result.
type Bulk struct {
	// Operation names the bulk ("captures.bulk"): the scope of the
	// operation keys, as Route.Operation. Required.
	Operation string
	// ItemOperation names what one item does: the scope of the item keys,
	// shared by every bulk operation that carries them, so that an item
	// accepted under one operation key is already accepted under any other.
	// It must differ from the Operation of every Handle route. Default:
	// Operation + ".item".
	ItemOperation string
	// MaxItems bounds the items of one request; a request with more is
	// answered 413 TOO_MANY_BULK_ITEMS, and nothing is stored or run. The
	// whole answer must also fit in Config.MaxStoredBodyBytes. At most
	// MaxBulkItems. Default: DefaultMaxBulkItems.
	MaxItems int
	// Template is the route template in the fingerprint, as Route.Template.
	Template string
}

// ItemStatus is what became of one item of a bulk request.
type ItemStatus string

// Item statuses, the "status" member of each result.
const (
	// ItemAccepted: the item handler ran and committed; the result carries
	// what it returned.
	ItemAccepted ItemStatus = "accepted"
	// ItemAlreadyAccepted: an earlier operation accepted this item key with
	// the same item; the result carries that operation's result, and the
	// handler did not run.
	ItemAlreadyAccepted ItemStatus = "already_accepted"
	// ItemRejected: the handler refused the item (Invalid, Reject), or its
	// key was accepted before for another item (problem
	// IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST). Nothing of it is kept:
	// a corrected item may be sent again, under a new operation key.
	ItemRejected ItemStatus = "rejected"
	// ItemFailed: the handler failed (an error); nothing of the item is
	// kept, and a new operation that carries it runs it again.
	ItemFailed ItemStatus = "failed"
)

// ItemHandler handles one item of a bulk request: item is the item's JSON
// object, itemKey included. It runs in the bulk's transaction under a
// savepoint of its own (tx.Commit and tx.Rollback return ErrTxOwned), and
// FromContext(ctx) returns the item's claim, whose KeyID is stable across
// every operation that carries the item key: derive the item's identities
// from it.
//
// It returns the members to add to the item's result, as a value that
// encodes as a JSON object (a struct, a map, nil for none) without itemKey,
// status or problem members. Invalid(err) or Reject(resp) rejects the item,
// any other error fails it; either way the savepoint rolls back and the
// other items go on. A panic ends the whole request like a crash.
type ItemHandler func(ctx context.Context, tx pgx.Tx, item json.RawMessage) (any, error)

// Bulk returns an http.Handler that runs h once per item key across every
// operation, for the bulk endpoint b. The operation's own key behaves as
// any Idempotency-Key: the same key with the same body replays the stored
// answer byte for byte, with another body gets 422. Like Handle, it panics on
// a programming error.
func (m *Middleware) Bulk(b Bulk, h ItemHandler) http.Handler {
	if b.ItemOperation == "" {
		b.ItemOperation = b.Operation + ".item"
	}
	if b.MaxItems == 0 {
		b.MaxItems = DefaultMaxBulkItems
	}
	if b.Operation == "" || !utf8.ValidString(b.ItemOperation) || b.ItemOperation == b.Operation || h == nil ||
		b.MaxItems < 0 || b.MaxItems > MaxBulkItems {
		panic(fmt.Sprintf("httpinbox: Bulk needs an Operation, another ItemOperation, 1 to %d MaxItems and a handler, got %+v",
			MaxBulkItems, b))
	}
	bk := &bulk{m: m, cfg: b, h: h, sql: newBulkSQL(m.cfg.Tables)}
	return m.Handle(Route{Operation: b.Operation, Template: b.Template}, bk.handle)
}

// The statements of item records. Items are claimed in key_id order in one
// statement, so two operations that share items wait for each other
// instead of deadlocking; an item key held by another operation's open
// transaction is waited for (bounded by lock_timeout, set to the lease).
const (
	bulkLockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

	// bulkDeleteExpiredSQL deletes the expired item records that are
	// forgotten: all of them when the route keeps no tombstones ($2), else
	// those whose tombstone has passed.
	bulkDeleteExpiredSQL = `DELETE FROM {keys} WHERE key_id IN (
	SELECT key_id FROM {keys} WHERE key_id = ANY($1::bytea[]) AND expires_at <= now()
		AND ($2 OR coalesce(forget_at, expires_at) <= now())
	ORDER BY key_id FOR UPDATE)`

	bulkClaimSQL = `INSERT INTO {keys}
	(key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at, forget_at)
SELECT u.key_id, $4, $5, $6, u.item_key, u.fingerprint, $7, now() + $8 * interval '1 microsecond', now() + $9 * interval '1 microsecond',
	now() + $10 * interval '1 microsecond'
FROM unnest($1::bytea[], $2::text[], $3::bytea[]) AS u(key_id, item_key, fingerprint)
ORDER BY u.key_id
ON CONFLICT (key_id) DO NOTHING`

	bulkExistingSQL = `SELECT key_id, fingerprint, state, expires_at <= now(), coalesce(body, '{}'::bytea) FROM {keys}
WHERE key_id = ANY($1::bytea[]) AND lock_owner IS DISTINCT FROM $2`

	bulkCompleteSQL = `UPDATE {keys}
SET state = 'completed', status_code = 200, headers = '{"Content-Type":["application/json"]}', body = $3,
	completed_at = now(), lock_owner = NULL, locked_until = NULL
WHERE key_id = $1 AND lock_owner = $2 AND state = 'started'`

	bulkForgetSQL = `DELETE FROM {keys} WHERE key_id = $1 AND lock_owner = $2 AND state = 'started'`
)

type bulkSQL struct{ lockTimeout, deleteExpired, claim, existing, complete, forget string }

func newBulkSQL(t idem.Tables) bulkSQL {
	r := strings.NewReplacer("{keys}", t.Table("http_keys"))
	return bulkSQL{lockTimeout: bulkLockTimeoutSQL, deleteExpired: r.Replace(bulkDeleteExpiredSQL),
		claim: r.Replace(bulkClaimSQL), existing: r.Replace(bulkExistingSQL),
		complete: r.Replace(bulkCompleteSQL), forget: r.Replace(bulkForgetSQL)}
}

// bulk is one bulk endpoint.
type bulk struct {
	m   *Middleware
	cfg Bulk
	h   ItemHandler
	sql bulkSQL
}

// bulkItem is one item of a request, with its claim and fingerprint.
type bulkItem struct {
	raw   json.RawMessage
	claim *Claim
	fp    idem.Hash
}

// storedItem is an item key that an earlier operation holds.
type storedItem struct {
	fingerprint []byte
	state       KeyState
	expired     bool   // its tombstone lasts: refuse the item key
	result      []byte // the members the handler returned, as a JSON object
}

// handle is the operation's Handler: parse, claim the item keys, run each
// item, answer.
func (b *bulk) handle(ctx context.Context, tx pgx.Tx, r *http.Request) (Response, error) {
	items, err := b.parse(ctx, r)
	if err != nil {
		return Response{}, err
	}
	stored, err := b.claim(ctx, tx, items)
	if err != nil {
		return Response{}, err
	}
	results := make([][]byte, len(items))
	partial := false
	for i, it := range items {
		var st ItemStatus
		if results[i], st, err = b.runItem(ctx, tx, it, stored); err != nil {
			return Response{}, err
		}
		partial = partial || (st != ItemAccepted && st != ItemAlreadyAccepted)
		b.m.metrics.bulkItems.Add(ctx, 1, b.m.metrics.statusOpt(b.cfg.ItemOperation, string(st)))
	}
	body := append([]byte(`{"items":[`), bytes.Join(results, []byte(","))...)
	body = append(body, "]}"...)
	if len(body) > b.m.cfg.MaxStoredBodyBytes {
		return Response{}, fmt.Errorf("httpinbox: the answer to %d items has %d bytes, over MaxStoredBodyBytes %d: lower Bulk.MaxItems or raise the limit",
			len(items), len(body), b.m.cfg.MaxStoredBodyBytes)
	}
	status := http.StatusOK
	if partial {
		status = http.StatusMultiStatus
	}
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
}

// parse reads {"items":[…]} and gives every item its claim and fingerprint.
// A malformed request is rejected (400, or 413 for too many items) and
// nothing is kept.
func (b *bulk) parse(ctx context.Context, r *http.Request) ([]bulkItem, error) {
	var req map[string]json.RawMessage
	var raws []json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req) != 1 || req["items"] == nil {
		return nil, Invalid(errors.New(`the body must be one JSON object {"items":[…]}`))
	}
	if err := json.Unmarshal(req["items"], &raws); err != nil || len(raws) == 0 {
		return nil, Invalid(errors.New(`"items" must be a non-empty array of objects`))
	}
	if len(raws) > b.cfg.MaxItems {
		return nil, Reject(Problem(http.StatusRequestEntityTooLarge, CodeTooManyItems,
			fmt.Sprintf("%d items; at most %d per request", len(raws), b.cfg.MaxItems)))
	}
	op := FromContext(ctx)
	items := make([]bulkItem, len(raws))
	seen := make(map[string]int, len(raws))
	for i, raw := range raws {
		var members map[string]json.RawMessage
		var key string
		if err := json.Unmarshal(raw, &members); err != nil || json.Unmarshal(members[ItemKeyMember], &key) != nil {
			return nil, Invalid(fmt.Errorf("item %d must be an object with a string %q", i, ItemKeyMember))
		}
		if err := checkKey(key, b.m.cfg.MaxKeyLength); err != nil {
			return nil, Invalid(fmt.Errorf("item %d: invalid %s: %w", i, ItemKeyMember, err))
		}
		if j, dup := seen[key]; dup {
			return nil, Invalid(fmt.Errorf("items %d and %d have the same %s %q", j, i, ItemKeyMember, key))
		}
		seen[key] = i
		c := &Claim{id: scopeID(op.tenant, op.caller, b.cfg.ItemOperation, key), tenant: op.tenant, caller: op.caller,
			operation: b.cfg.ItemOperation, key: key, owner: op.owner, expiry: op.expiry, tombstone: op.tombstone}
		items[i] = bulkItem{raw: raw, claim: c, fp: itemFingerprint(c, raw)}
	}
	return items, nil
}

// claim takes every item key that no earlier operation holds, in one
// statement, and returns the records of those that one does.
func (b *bulk) claim(ctx context.Context, tx pgx.Tx, items []bulkItem) (map[idem.Hash]storedItem, error) {
	ids, keys, fps := make([][]byte, len(items)), make([]string, len(items)), make([][]byte, len(items))
	for i, it := range items {
		ids[i], keys[i], fps[i] = it.claim.id[:], it.claim.key, it.fp[:]
	}
	op := FromContext(ctx)
	batch := &pgx.Batch{}
	batch.Queue(b.sql.lockTimeout, strconv.FormatInt(b.m.cfg.Lease.Milliseconds(), 10)+"ms")
	batch.Queue(b.sql.deleteExpired, ids, op.tombstone == 0)
	batch.Queue(b.sql.claim, ids, keys, fps, op.tenant, op.caller, b.cfg.ItemOperation, op.owner,
		b.m.cfg.Lease.Microseconds(), op.expiry.Microseconds(), (op.expiry + op.tombstone).Microseconds())
	stored := map[idem.Hash]storedItem{}
	var (
		id []byte
		s  storedItem
	)
	batch.Queue(b.sql.existing, ids, op.owner).Query(func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&id, &s.fingerprint, &s.state, &s.expired, &s.result}, func() error {
			h, err := idem.HashFromBytes(id)
			stored[h] = s
			return err
		})
		return err
	})
	err := tx.SendBatch(ctx, batch).Close()
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available: another operation holds an item
		p := Problem(http.StatusConflict, CodeInProgress, "another request is accepting items of this one; retry with the same key")
		p.Header.Set("Retry-After", strconv.Itoa(retryAfter(b.m.cfg.RetryAfter)))
		return nil, Reject(p)
	}
	if err != nil {
		return nil, fmt.Errorf("httpinbox: claim %d item keys: %w", len(items), err)
	}
	return stored, nil
}

// runItem answers one item: from an earlier operation's record, or by
// running the handler under a savepoint. An error ends the whole request.
func (b *bulk) runItem(ctx context.Context, tx pgx.Tx, it bulkItem, stored map[idem.Hash]storedItem) ([]byte, ItemStatus, error) {
	if prev, ok := stored[it.claim.id]; ok {
		switch {
		case prev.expired:
			return b.refused(it, ItemRejected, Problem(http.StatusUnprocessableEntity, CodeKeyExpired,
				"this itemKey expired and its item may have taken effect; send the item again with a new itemKey"))
		case !bytes.Equal(prev.fingerprint, it.fp[:]):
			return b.refused(it, ItemRejected, Problem(http.StatusUnprocessableEntity, CodeKeyReused,
				"this itemKey was accepted before for a different item"))
		case prev.state == KeyStarted:
			return b.refused(it, ItemFailed, Problem(http.StatusConflict, CodeInProgress, "this itemKey is in progress"))
		}
		out, err := joinObject(itemHead(it, ItemAlreadyAccepted), objectInside(prev.result), nil)
		return out, ItemAlreadyAccepted, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("httpinbox: savepoint for item %q: %w", it.claim.key, err)
	}
	result, herr := b.h(context.WithValue(ctx, claimKey{}, it.claim), ownedTx{sp}, it.raw)
	var app []byte
	if herr == nil {
		app, herr = appMembers(result, ItemKeyMember, "status", "problem")
	}
	if herr == nil {
		herr = b.complete(ctx, sp, it, app)
	}
	if herr == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, "", fmt.Errorf("httpinbox: release savepoint of item %q: %w", it.claim.key, err)
		}
		out, err := joinObject(itemHead(it, ItemAccepted), app, nil)
		return out, ItemAccepted, err
	}
	if err := sp.Rollback(ctx); err != nil {
		return nil, "", fmt.Errorf("httpinbox: roll back item %q: %w", it.claim.key, err)
	}
	if _, err := tx.Exec(ctx, b.sql.forget, it.claim.id[:], it.claim.owner); err != nil {
		return nil, "", fmt.Errorf("httpinbox: release item %q: %w", it.claim.key, err)
	}
	var rej *rejection
	if errors.As(herr, &rej) {
		return b.refused(it, ItemRejected, rej.problem())
	}
	b.m.log.Error("httpinbox: bulk item failed; a new operation may carry it again",
		"operation", it.claim.operation, "key_id", it.claim.id.Short(), "error", herr)
	return b.refused(it, ItemFailed, Problem(http.StatusInternalServerError, CodeInternal,
		"the item failed and nothing of it was kept; send it again in a new operation"))
}

// complete stores the item's result in its record, inside its savepoint.
func (b *bulk) complete(ctx context.Context, sp pgx.Tx, it bulkItem, app []byte) error {
	result := append(append([]byte{'{'}, app...), '}')
	tag, err := sp.Exec(ctx, b.sql.complete, it.claim.id[:], it.claim.owner, result)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("item record not held by this request")
	}
	if err != nil {
		return fmt.Errorf("httpinbox: store item %q: %w", it.claim.key, err)
	}
	return nil
}

// refused is the result of an item that was not run or not kept.
func (b *bulk) refused(it bulkItem, st ItemStatus, p Response) ([]byte, ItemStatus, error) {
	out, err := joinObject(itemHead(it, st), nil, []member{{"problem", json.RawMessage(p.Body)}})
	return out, st, err
}

// itemHead is the members every item result starts with.
func itemHead(it bulkItem, st ItemStatus) []member {
	return []member{{ItemKeyMember, it.claim.key}, {"status", st}}
}

// itemFingerprint is an item's identity for conflict detection: its scope
// and its JSON, canonical when it has a canonical form.
func itemFingerprint(c *Claim, item []byte) idem.Hash {
	h := sha256.New()
	writeField(h, "idem.httpinbox.item/v1")
	for _, s := range []string{c.tenant, c.caller, c.operation} {
		writeField(h, s)
	}
	writeBody(h, item)
	return idem.Hash(h.Sum(nil))
}
