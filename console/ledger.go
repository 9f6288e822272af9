package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/ledger"
)

// The ledger screen shows what waits for an operator or the dispatcher:
// unknown effects (the outcome cannot be told; nothing retries them
// blindly), failed_terminal effects nobody resolved, and effects due or
// retrying. Unknown and due effects are keyset pages of their partial
// indexes; failed_terminal effects have no index of their own, so they are
// found in windows of the settled index, like rare dead letters.

// ledgerSection names a list of the ledger screen.
type ledgerSection string

// The sections.
const (
	sectionUnknown  ledgerSection = "unknown"
	sectionTerminal ledgerSection = "failed_terminal"
	sectionDue      ledgerSection = "due"
)

// terminalScan is how many settled effects one window reads.
const terminalScan = 10000

// overviewRows is how many rows each section shows when all three are on
// one page.
const overviewRows = 20

// effectPage is a page of a section.
type effectPage struct {
	Section ledgerSection
	Title   string
	Count   count
	Rows    []ledger.Entry
	Scanned int64  // failed_terminal: settled effects read to find them
	Next    string // the cursor of the next page; "" at the end
	More    bool   // Next continues a search
}

// NextQuery is the query string of the section's next page, encoded by
// url.Values, so the template may take it as it is.
func (p effectPage) NextQuery() template.URL {
	return template.URL(url.Values{"show": {string(p.Section)}, "after": {p.Next}}.Encode())
}

// ledgerData is the ledger page.
type ledgerData struct {
	Sections []effectPage
	One      bool // one section, paged
	Effects  count
}

// ledger shows the three sections, or one section's page.
func (c *Console) ledger(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	q := r.URL.Query()
	show := ledgerSection(q.Get("show"))
	d := ledgerData{}
	var err error
	if d.Effects, err = c.store.tableSize(ctx, "ledger"); err != nil {
		c.fail(w, r, err)
		return
	}
	for _, sec := range []ledgerSection{sectionUnknown, sectionTerminal, sectionDue} {
		if show != "" && show != sec {
			continue
		}
		limit, after := overviewRows, ""
		if show != "" {
			limit, after, d.One = pageSize, q.Get("after"), true
		}
		p, err := c.store.effects(ctx, sec, after, limit)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Sections = append(d.Sections, p)
	}
	if len(d.Sections) == 0 {
		c.refuse(w, r, http.StatusNotFound, "no such list")
		return
	}
	c.render(w, r, s, http.StatusOK, "ledger", "Ledger", d)
}

// effects returns a page of sec after the cursor after. Console queries:
// ledger.List has no cursor, and sorts every match of a status.
func (s *store) effects(ctx context.Context, sec ledgerSection, after string, limit int) (effectPage, error) {
	at, id := parseCursor(after)
	p := effectPage{Section: sec}
	var err error
	switch sec {
	case sectionUnknown:
		p.Title = "Unknown: the outcome cannot be told; resolve after asking the target"
		if p.Count, err = s.cappedCount(ctx, s.sql.countUnknown, ""); err == nil {
			p.Rows, err = s.entries(ctx, s.sql.unknownPage, at, id, limit+1)
		}
	case sectionDue:
		p.Title = "Due and retrying: waiting for the dispatcher"
		if p.Count, err = s.cappedCount(ctx, s.sql.countDue, ""); err == nil {
			p.Rows, err = s.entries(ctx, s.sql.duePage, at, id, limit+1)
		}
	case sectionTerminal:
		p.Title = "Failed for good, not yet resolved by an operator"
		return s.terminal(ctx, p, after, limit)
	}
	if err != nil {
		return p, fmt.Errorf("ledger %s: %w", sec, err)
	}
	if len(p.Rows) > limit {
		p.Rows = p.Rows[:limit]
		last := p.Rows[limit-1]
		p.Next = cursor(last.NextAttemptAt, last.ID)
	}
	return p, nil
}

// terminal returns a page of failed_terminal effects nobody resolved,
// found in a window of settled effects below the cursor.
func (s *store) terminal(ctx context.Context, p effectPage, after string, limit int) (effectPage, error) {
	at, id := parseCursor(after)
	if after == "" {
		at, id = time.Now().Add(time.Hour), "" // later than any settled effect
	}
	var err error
	if p.Count, err = s.terminalCount(ctx); err != nil {
		return p, err
	}
	var (
		lastAt *time.Time
		lastID string
		ids    []string
	)
	err = s.pool.QueryRow(ctx, s.sql.terminalWindow, at, id, terminalScan, limit+1).Scan(&p.Scanned, &lastAt, &lastID, &ids)
	if err != nil {
		return p, fmt.Errorf("ledger failed_terminal: %w", err)
	}
	byID := map[string]ledger.Entry{}
	rows, err := s.entries(ctx, s.sql.byIDs, ids)
	if err != nil {
		return p, fmt.Errorf("ledger failed_terminal: %w", err)
	}
	for _, e := range rows {
		byID[e.ID] = e
	}
	for _, id := range ids {
		if e, ok := byID[id]; ok {
			p.Rows = append(p.Rows, e)
		}
	}
	switch {
	case len(p.Rows) > limit:
		p.Rows = p.Rows[:limit]
		last := p.Rows[limit-1]
		p.Next = cursor(settled(last), last.ID)
	case p.Scanned >= terminalScan && lastAt != nil:
		p.Next, p.More = cursor(*lastAt, lastID), true
	}
	return p, nil
}

// terminalCount counts the failed_terminal effects nobody resolved when
// the ledger is small enough to count; otherwise it is the planner's
// estimate of the failed_terminal effects, resolved or not (no index
// counts them).
func (s *store) terminalCount(ctx context.Context) (count, error) {
	size, err := s.tableSize(ctx, "ledger")
	if err != nil {
		return count{}, err
	}
	if size.Kind == exact {
		var n int64
		err := s.pool.QueryRow(ctx, s.sql.countTerminal).Scan(&n)
		return count{N: n}, err
	}
	n, err := s.estimate(ctx, s.sql.estimateTerminal)
	return count{N: n, Kind: estimated}, err
}

// settled is when an effect settled, as the settled index orders them.
func settled(e ledger.Entry) time.Time {
	if e.CompletedAt.IsZero() {
		return e.CreatedAt
	}
	return e.CompletedAt
}

// entries runs a query returning entryColumns.
func (s *store) entries(ctx context.Context, sql string, args ...any) ([]ledger.Entry, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledger.Entry, error) {
		var (
			e         ledger.Entry
			status    string
			completed *time.Time
		)
		err := r.Scan(&e.ID, &e.Type, &e.Consumer, &e.MessageID, &e.BusinessKey, &e.Target, &status, &e.AttemptCount,
			&e.NextAttemptAt, &e.LastError, &e.CreatedAt, &completed)
		e.Status = ledger.Status(status)
		if completed != nil {
			e.CompletedAt = *completed
		}
		return e, err
	})
}

// cursor is a keyset position: a time and an effect id.
func cursor(at time.Time, id string) string { return at.UTC().Format(time.RFC3339Nano) + "~" + id }

// parseCursor reads a cursor; the start of the list when there is none.
func parseCursor(c string) (time.Time, string) {
	ts, id, ok := strings.Cut(c, "~")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return time.Time{}, "" // before any effect; effect ids are never empty
	}
	return at, id
}

// effectData is an effect's page.
type effectData struct {
	Entry      ledger.Entry
	History    []ledger.AuditRecord
	Tombstone  *ledger.Tombstone
	Revealed   bool
	Resolvable bool
}

// effect shows one effect (ledger.Get, ledger.History), or its tombstone.
func (c *Console) effect(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id := r.URL.Query().Get("id")
	led := c.store.ledger
	e, err := led.Get(ctx, id)
	if errors.Is(err, ledger.ErrNotFound) {
		ts, terr := led.Tombstone(ctx, id)
		if terr != nil {
			c.refuse(w, r, http.StatusNotFound, "no effect has this id, and no tombstone")
			return
		}
		c.render(w, r, s, http.StatusOK, "effect", "Effect", effectData{Tombstone: &ts})
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	h, err := led.History(ctx, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := effectData{Entry: e, History: h, Resolvable: e.Status != ledger.StatusSucceeded &&
		e.Status != ledger.StatusSuppressed && e.Status != ledger.StatusInFlight}
	if c.cfg.ShowPayloads && r.URL.Query().Get("payload") == "1" {
		d.Revealed = true
		c.cfg.Logger.Info("console: effect request shown", "operator", s.operator, "effect", id)
	} else {
		d.Entry.Request, d.Entry.Response = nil, nil
	}
	c.render(w, r, s, http.StatusOK, "effect", "Effect", d)
}

// resolutions are the decisions an operator can take about an effect.
var resolutions = map[string]ledger.Status{
	"succeeded": ledger.StatusSucceeded,
	"failed":    ledger.StatusFailedTerminal,
	"retry":     ledger.StatusPending,
}

// resolveEffects resolves the selected effects (ledger.Resolve, which
// audits each decision), one at a time.
func (c *Console) resolveEffects(w http.ResponseWriter, r *http.Request, s *session) {
	as, ok := resolutions[r.PostForm.Get("as")]
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "resolve as succeeded, failed or retry")
		return
	}
	c.resolveEach(w, r, s, "Resolve effects as "+string(as), "/ledger", func(ctx context.Context, id, reason string) (string, error) {
		e, err := c.store.ledger.Resolve(ctx, id, ledger.Resolution{As: as, Reason: reason, Operator: s.operator})
		return string(e.Status), err
	}, ledger.ErrInFlight, ledger.ErrNotResolvable, ledger.ErrNotFound)
}
