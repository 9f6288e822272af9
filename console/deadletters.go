package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
)

// Dead letters at depth: the groups (consumer × reason) are those of the
// newest groupCap rows, read backwards on the primary key, with the
// planner's estimate of each group's size beyond them; the list reads
// windows of listScan rows below a cursor and keeps the rows that match, so
// that a rare reason costs a few clicks, never a scan of the table. A
// message id is found through the (consumer, message_id) index.
const (
	groupCap  = 10000
	listScan  = 20000
	pageSize  = 50
	maxGroups = 100
)

// deadRow is a dead letter as the list shows it: the library's record,
// without its payload, and whether it has one.
type deadRow struct {
	deadletters.Record
	HasPayload bool
}

// Settled reports whether the row left the dead-letter queue's care:
// redriven, or discarded.
func (d deadRow) Settled() bool { return !d.RedrivenAt.IsZero() }

// Discarded reports whether an operator discarded it (see discardSQL), and
// Redriven whether it was redriven.
func (d deadRow) Discarded() bool { return strings.HasPrefix(d.RedrivenBy, discardedPrefix) }

// Redriven reports whether the row was redriven.
func (d deadRow) Redriven() bool { return d.Settled() && !d.Discarded() }

// groupView is one consumer × reason group.
type groupView struct {
	Consumer, Reason string
	Sources          []string
	Pending          count
	Redriven         int64
	Oldest, Newest   time.Time
}

// deadFilter is the list's filter, from the query string.
type deadFilter struct {
	Consumer, Reason, ID string
	All                  bool  // include redriven and discarded rows
	Before               int64 // list rows below this id; 0: from the newest
}

// Query is the filter as a query string, with before: url.Values encodes
// it, so the template may take it as it is.
func (f deadFilter) Query(before int64) template.URL {
	v := url.Values{}
	for k, s := range map[string]string{"consumer": f.Consumer, "reason": f.Reason, "id": f.ID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.All {
		v.Set("all", "1")
	}
	if before > 0 {
		v.Set("before", strconv.FormatInt(before, 10))
	}
	return template.URL(v.Encode())
}

// deadPage is a page of the list and where the next one starts.
type deadPage struct {
	Rows    []deadRow
	Scanned int64 // rows read to find them
	Next    int64 // the cursor of the next page; 0 at the end
	More    bool  // Next continues a search (no match in the window yet)
}

// deadLettersData is the dead letters page.
type deadLettersData struct {
	Groups     []groupView
	GroupsFull bool
	GroupsFrom time.Time
	MoreGroups bool
	Total      count
	Filter     deadFilter
	Page       deadPage
	Filtered   bool
	AMQP       bool
}

// deadLetters shows the groups and the filtered list.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	q := r.URL.Query()
	f := deadFilter{Consumer: q.Get("consumer"), Reason: q.Get("reason"), ID: q.Get("id"), All: q.Get("all") == "1"}
	f.Before, _ = strconv.ParseInt(q.Get("before"), 10, 64)
	d := deadLettersData{Filter: f, Filtered: f.Consumer != "" || f.Reason != "" || f.ID != "", AMQP: len(c.cfg.AMQPURLs) > 0}
	var err error
	if d.Groups, d.GroupsFull, d.GroupsFrom, err = c.store.deadGroups(ctx); err != nil {
		c.fail(w, r, err)
		return
	}
	if len(d.Groups) > maxGroups {
		d.Groups, d.MoreGroups = d.Groups[:maxGroups], true
	}
	if d.Total, err = c.store.tableSize(ctx, "dead_letters"); err != nil {
		c.fail(w, r, err)
		return
	}
	if d.Page, err = c.store.deadList(ctx, f); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, s, http.StatusOK, "deadletters", "Dead letters", d)
}

// deadGroups groups the newest groupCap dead letters by consumer and
// reason; when the window is full, each group's pending count is a lower
// bound, and the planner's estimate of the group's size is shown when it
// is larger. Console query: no library function groups dead letters.
func (s *store) deadGroups(ctx context.Context) (groups []groupView, full bool, from time.Time, err error) {
	rows, err := s.pool.Query(ctx, s.sql.groupWindow, groupCap)
	if err != nil {
		return nil, false, from, fmt.Errorf("dead-letter groups: %w", err)
	}
	defer rows.Close()
	byKey := map[[2]string]*groupView{}
	var order [][2]string
	var total int64
	for rows.Next() {
		var (
			consumer, reason, source string
			pending, redriven        int64
			oldest, newest           *time.Time
			first                    time.Time
			minID                    int64
		)
		if err := rows.Scan(&consumer, &reason, &source, &pending, &redriven, &oldest, &newest, &first, &minID); err != nil {
			return nil, false, from, fmt.Errorf("dead-letter groups: %w", err)
		}
		total += pending + redriven
		if from.IsZero() || first.Before(from) {
			from = first
		}
		k := [2]string{consumer, reason}
		g := byKey[k]
		if g == nil {
			g = &groupView{Consumer: consumer, Reason: reason}
			byKey[k] = g
			order = append(order, k)
		}
		g.Sources = append(g.Sources, source)
		g.Pending.N += pending
		g.Redriven += redriven
		if oldest != nil && (g.Oldest.IsZero() || oldest.Before(g.Oldest)) {
			g.Oldest = *oldest
		}
		if newest != nil && newest.After(g.Newest) {
			g.Newest = *newest
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, from, fmt.Errorf("dead-letter groups: %w", err)
	}
	full = total >= groupCap
	for _, k := range order {
		groups = append(groups, *byKey[k])
	}
	if full {
		err = s.estimateGroups(ctx, groups)
	}
	return groups, full, from, err
}

// estimateGroups marks the groups' counts as lower bounds, or replaces
// them with the planner's estimate where it is larger.
func (s *store) estimateGroups(ctx context.Context, groups []groupView) error {
	for i := range groups {
		g := &groups[i]
		g.Pending.Kind = atLeast
		if i >= maxGroups || g.Pending.N == 0 {
			continue
		}
		e, err := s.estimate(ctx, s.sql.estimateGroup, pgx.QueryExecModeExec, g.Consumer, g.Reason)
		if err != nil {
			return err
		}
		if e > g.Pending.N {
			g.Pending = count{N: e, Kind: estimated}
		}
	}
	return nil
}

// deadList returns a page of the list. Console query: deadletters.List has
// no cursor and no bound on the rows it reads to find a rare reason.
func (s *store) deadList(ctx context.Context, f deadFilter) (deadPage, error) {
	before := f.Before
	if before <= 0 {
		before = 1<<63 - 1
	}
	if f.ID != "" {
		return s.deadByMessageID(ctx, f, before)
	}
	var (
		p      deadPage
		lowest int64
		ids    []int64
	)
	err := s.pool.QueryRow(ctx, s.sql.deadWindow, before, listScan, f.Consumer, f.Reason, f.All, pageSize+1).
		Scan(&p.Scanned, &lowest, &ids)
	if err != nil {
		return p, fmt.Errorf("dead letters: %w", err)
	}
	if len(ids) > pageSize {
		ids, p.Next = ids[:pageSize], ids[pageSize-1]
	} else if p.Scanned >= listScan && lowest > 1 {
		p.Next, p.More = lowest, true
	}
	p.Rows, err = s.deadRows(ctx, ids)
	return p, err
}

// deadByMessageID finds a message id's dead letters through the
// (consumer, message_id) index, among the consumer's or every consumer's.
func (s *store) deadByMessageID(ctx context.Context, f deadFilter, before int64) (deadPage, error) {
	consumers := []string{f.Consumer}
	if f.Consumer == "" {
		var err error
		if consumers, err = s.consumers(ctx, "dead_letters"); err != nil {
			return deadPage{}, err
		}
	}
	rows, err := s.pool.Query(ctx, s.sql.deadByID, consumers, f.ID, f.Reason, f.All, before, pageSize+1)
	if err != nil {
		return deadPage{}, fmt.Errorf("dead letters of %q: %w", f.ID, err)
	}
	list, err := pgx.CollectRows(rows, scanDead)
	if err != nil {
		return deadPage{}, fmt.Errorf("dead letters of %q: %w", f.ID, err)
	}
	p := deadPage{Rows: list, Scanned: int64(len(list))}
	if len(list) > pageSize {
		p.Rows, p.Next = list[:pageSize], list[pageSize-1].ID
	}
	return p, nil
}

// deadRows reads dead letters by id, newest first.
func (s *store) deadRows(ctx context.Context, ids []int64) ([]deadRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.sql.deadRows, ids)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDead)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	return out, nil
}

// scanDead reads a row of deadColumns.
func scanDead(r pgx.CollectableRow) (deadRow, error) {
	var (
		d            deadRow
		hash, stored []byte
		redrivenAt   *time.Time
	)
	err := r.Scan(&d.ID, &d.Consumer, &d.MessageID, &hash, &d.Reason, &d.Error, &d.Source, &d.Attempts, &d.At,
		&redrivenAt, &d.RedrivenBy, &d.HasPayload, &d.Exchange, &d.RoutingKey, &stored)
	if err != nil {
		return d, err
	}
	d.PayloadHash, _ = idem.HashFromBytes(hash)
	if h, err := idem.HashFromBytes(stored); err == nil {
		d.StoredHash = &h
	}
	if redrivenAt != nil {
		d.RedrivenAt = *redrivenAt
	}
	return d, nil
}

// deadLetterData is a dead letter's page.
type deadLetterData struct {
	Row      deadRow
	Payload  []byte // only when asked, and when the console shows payloads
	Revealed bool
	Applied  *inbox.Record // the inbox row of its id, if any
	Horizon  string        // why a redrive would be refused; "" when it would not
	DLQ      string
	AMQP     bool
}

// deadLetter shows one dead letter: what its row stores, whether its id is
// in the inbox, whether a redrive would be refused, and its payload when
// asked (and allowed).
func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		c.refuse(w, r, http.StatusNotFound, "no such dead letter")
		return
	}
	rows, err := c.store.deadRows(ctx, []int64{id})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if len(rows) == 0 {
		c.refuse(w, r, http.StatusNotFound, "no such dead letter")
		return
	}
	d := deadLetterData{Row: rows[0], DLQ: deadletters.QueueName(baseQueue(rows[0].Source)), AMQP: len(c.cfg.AMQPURLs) > 0}
	if err := c.store.fate(ctx, &d); err != nil {
		c.fail(w, r, err)
		return
	}
	if c.cfg.ShowPayloads && r.URL.Query().Get("payload") == "1" && d.Row.HasPayload {
		if d.Payload, err = c.store.payload(ctx, id); err != nil {
			c.fail(w, r, err)
			return
		}
		d.Revealed = true
		c.cfg.Logger.Info("console: payload shown", "operator", s.operator, "dead_letter", id)
	}
	c.render(w, r, s, http.StatusOK, "deadletter", "Dead letter "+strconv.FormatInt(id, 10), d)
}

// fate fills whether the dead letter's id has an inbox row
// (inbox.Inbox.Lookup) and whether a redrive would be refused by the
// consumer's horizon (inbox.Inbox.CheckSeen), as Redrive asks it.
func (s *store) fate(ctx context.Context, d *deadLetterData) error {
	rec, err := s.inbox.Lookup(ctx, s.pool, d.Row.Consumer, d.Row.MessageID)
	switch {
	case err == nil:
		d.Applied = &rec
	case !errors.Is(err, inbox.ErrNotFound):
		return err
	}
	err = s.inbox.CheckSeen(ctx, s.pool, d.Row.Consumer, d.Row.At)
	switch {
	case errors.Is(err, inbox.ErrBeyondHorizon):
		d.Horizon = err.Error()
	case err != nil:
		return err
	}
	return nil
}

// payload reads a dead letter's payload. Console query: deadletters.List
// reads it, but not by row id.
func (s *store) payload(ctx context.Context, id int64) ([]byte, error) {
	var b []byte
	err := s.pool.QueryRow(ctx, `SELECT payload FROM `+s.cfg.Tables.Table("dead_letters")+` WHERE id = $1`, id).Scan(&b)
	if err != nil {
		return nil, fmt.Errorf("payload of dead letter %d: %w", id, err)
	}
	return b, nil
}
