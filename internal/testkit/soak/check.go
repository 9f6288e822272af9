package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// check compares what the examples' tables, queues and fakes hold with what
// was published, and records every check in rep. faulty are the dead letters
// the hung and poison messages the injector published must have become.
func (h *harness) check(ctx context.Context, rep *report, p plan, faulty []deadLetter) {
	for _, ex := range h.cfg.examples {
		er := exampleReport{Example: ex.String()}
		if ex == liveness {
			er.Faulty = len(faulty)
			er.Published = len(faulty)
		}
		for _, m := range p.msgs {
			if m.ex != ex {
				continue
			}
			er.Published++
			switch m.kind {
			case kindValid:
				er.Valid++
			case kindDup, kindRetry:
				er.Duplicates++
			case kindConflict, kindCaptureConflict:
				er.Conflicts++
			case kindMalformed:
				er.Malformed++
			}
		}
		if err := h.checkExample(ctx, rep, &er, p, ex, faulty); err != nil {
			rep.fail(ex.String(), "read the results", err.Error())
		}
		rep.Examples = append(rep.Examples, er)
	}
	if h.cfg.runs(payments) {
		h.checkGateway(ctx, rep)
	}
	h.checkQueues(ctx, rep)
	h.checkFaults(rep)
	h.checkRetention(rep)
	h.checkCrashes(rep, faulty)
	h.checkHangs(ctx, rep, faulty)
}

func (h *harness) checkExample(ctx context.Context, rep *report, er *exampleReport, p plan, ex example, faulty []deadLetter) error {
	inbox, forgotten, back, err := h.db.recall(ctx, ex)
	if err != nil {
		return err
	}
	er.Forgotten = forgotten
	var winners map[string]string
	if ex == payments {
		if winners, err = h.paymentWinners(ctx); err != nil {
			return err
		}
	}
	e := expect(p, ex, inbox, winners)
	rows := fmt.Sprintf("%d inbox rows", len(inbox))
	if forgotten > 0 {
		rows = fmt.Sprintf("%d inbox rows, %d of them deleted by the retention fault", len(inbox), forgotten)
	}
	rep.check(ex.String(), "every valid message processed exactly once (one inbox row, the payload of a published copy)",
		len(e.problems) == 0, summarize(e.problems, rows))
	if h.cfg.has(faultRetention) {
		rep.check(ex.String(), "no message whose inbox row the retention fault deleted was applied again", len(back) == 0,
			summarize(back, fmt.Sprintf("%d rows deleted, none claimed again", forgotten)))
	}
	switch ex {
	case quickstart:
		err = h.checkBalances(ctx, rep, er, p, e, ex)
	case liveness:
		if err = h.checkBalances(ctx, rep, er, p, e, ex); err == nil {
			err = h.checkApplied(ctx, rep, e)
		}
		e.dead = append(e.dead, faulty...)
	case payments:
		err = h.checkPayments(ctx, rep, er, p, e)
	case orders:
		err = h.checkOrders(ctx, rep, er, p, e)
	}
	if err != nil {
		return err
	}
	return h.checkDeadLetters(ctx, rep, er, ex, e.dead)
}

// checkBalances checks the balances of a deposit workload (quickstart,
// liveness).
func (h *harness) checkBalances(ctx context.Context, rep *report, er *exampleReport, p plan, e expectation, ex example) error {
	rows, err := h.db.pool.Query(ctx, `SELECT account, balance FROM `+h.db.table(ex, "balances"))
	if err != nil {
		return err
	}
	got := map[string]int64{}
	var (
		a string
		b int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&a, &b}, func() error { got[a] = b; return nil }); err != nil {
		return err
	}
	want := e.balances(p)
	var bad []string
	for _, acct := range sortedKeys(want, got) {
		if got[acct] != want[acct] {
			bad = append(bad, fmt.Sprintf("%s: balance %d, distinct deposits sum to %d", acct, got[acct], want[acct]))
		}
	}
	er.Effects = len(e.effective)
	rep.check(ex.String(), "every balance is the sum of its distinct deposits", len(bad) == 0,
		summarize(bad, fmt.Sprintf("%d accounts, %d deposits applied", len(want), len(e.effective))))
	return nil
}

// checkApplied checks the liveness worker's applied log: one row per
// processed message, none for any other, whichever process applied it; and
// records how many each process applied.
func (h *harness) checkApplied(ctx context.Context, rep *report, e expectation) error {
	applied, err := h.db.applied(ctx)
	if err != nil {
		return err
	}
	var bad []string
	rep.AppliedBy = map[string]int{}
	for _, id := range sortedKeys(applied, e.effective) {
		workers := applied[id]
		for _, w := range workers {
			rep.AppliedBy[w]++
		}
		_, effective := e.effective[id]
		switch {
		case !effective && len(workers) > 0:
			bad = append(bad, fmt.Sprintf("%s: applied by %v, and must not have been", id, workers))
		case effective && len(workers) != 1:
			bad = append(bad, fmt.Sprintf("%s: applied %d times (by %v)", id, len(workers), workers))
		}
	}
	rep.check("liveness", "every processed message applied exactly once, whichever process ran it (applied log)", len(bad) == 0,
		summarize(bad, fmt.Sprintf("%d applied; by process: %s", len(e.effective), describe(rep.AppliedBy))))
	return nil
}

// paymentWinners returns, per captureRequestId, the message id that holds
// its payment row.
func (h *harness) paymentWinners(ctx context.Context) (map[string]string, error) {
	rows, err := h.db.pool.Query(ctx, `SELECT capture_request_id, message_id FROM `+h.db.table(payments, "payments"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var cr, id string
	_, err = pgx.ForEachRow(rows, []any{&cr, &id}, func() error { out[cr] = id; return nil })
	return out, err
}

func (h *harness) checkPayments(ctx context.Context, rep *report, er *exampleReport, p plan, e expectation) error {
	rows, err := h.db.pool.Query(ctx, `SELECT capture_request_id, order_id, amount, currency FROM `+h.db.table(payments, "payments"))
	if err != nil {
		return err
	}
	got := map[string]capture{}
	var (
		cr string
		c  capture
	)
	if _, err := pgx.ForEachRow(rows, []any{&cr, &c.Order, &c.Amount, &c.Currency}, func() error { got[cr] = c; return nil }); err != nil {
		return err
	}
	want := e.captures(p)
	var bad []string
	for _, k := range sortedKeys(want, got) {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !gok:
			bad = append(bad, k+": no payment row")
		case !wok:
			bad = append(bad, k+": a payment row nothing asked for")
		case w != g:
			bad = append(bad, fmt.Sprintf("%s: payment %+v, the processed message asked for %+v", k, g, w))
		}
	}
	er.Effects = len(got)
	rep.check("payments", "one payment row per valid captureRequestId, as the processed message asked", len(bad) == 0,
		summarize(bad, fmt.Sprintf("%d payments", len(got))))
	return h.checkEffectKeys(ctx, rep, payments, "capture", keysOf(want))
}

// ledgerMaxAttempts is the workers' ledger.DispatcherConfig.MaxAttempts (the
// default; the workers do not expose it). A deduplicating executor's
// ambiguous attempt is sent again until then; an effect still unknown after
// it is one the executor could not prove.
const ledgerMaxAttempts = 20

// keysOf returns the keys of m as a set.
func keysOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// checkEffectKeys checks that the ledger of ex holds one succeeded effect
// per key of want and nothing else; unknown and failed effects are listed.
func (h *harness) checkEffectKeys(ctx context.Context, rep *report, ex example, what string, want map[string]bool) error {
	effects, dups, err := h.db.effects(ctx, ex)
	if err != nil {
		return err
	}
	var bad []string
	for _, k := range dups {
		bad = append(bad, k+": two effects")
	}
	statuses := map[string]int{}
	var retried []time.Duration
	var explained []string
	for k, e := range effects {
		statuses[e.status]++
		if !want[k] {
			bad = append(bad, k+": an effect nothing asked for")
		}
		switch {
		case e.status == "unknown" && e.attempts >= ledgerMaxAttempts:
			// Every attempt was ambiguous: the executor could not prove
			// the outcome and left it to an operator. Allowed, and shown.
			explained = append(explained, fmt.Sprintf("%s: unknown after %d attempts (%s)", k, e.attempts, e.lastError))
		case e.status != "succeeded":
			bad = append(bad, fmt.Sprintf("%s: %s after %d attempts (%s)", k, e.status, e.attempts, e.lastError))
		}
		if e.attempts > 1 && e.status == "succeeded" {
			retried = append(retried, e.took)
		}
	}
	for k := range want {
		if _, ok := effects[k]; !ok {
			bad = append(bad, k+": no effect recorded")
		}
	}
	sort.Strings(bad)
	detail := fmt.Sprintf("%d effects: %s", len(effects), describe(statuses))
	if len(explained) > 0 {
		detail += "; left to an operator: " + summarize(explained, "")
	}
	rep.check(ex.String(), fmt.Sprintf("one %s effect per business key, succeeded (unknown only after %d ambiguous attempts)", what, ledgerMaxAttempts),
		len(bad) == 0, summarize(bad, detail))
	if ex == payments {
		rep.RetriedCaptures = retried
	}
	return nil
}

func (h *harness) checkOrders(ctx context.Context, rep *report, er *exampleReport, p plan, e expectation) error {
	rows, err := h.db.pool.Query(ctx, `SELECT order_id, status, version, updated_at FROM `+h.db.table(orders, "order_overview"))
	if err != nil {
		return err
	}
	got := map[string]overviewRow{}
	var (
		id string
		r  overviewRow
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.Status, &r.Version, &r.UpdatedAt}, func() error { got[id] = r; return nil }); err != nil {
		return err
	}
	want, shipped := e.overview(p, h.pub.sentAt)
	var bad []string
	for _, k := range sortedKeys(want, got) {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !gok:
			bad = append(bad, k+": no row")
		case !wok:
			bad = append(bad, k+": a row no event made")
		case w.Status != g.Status || w.Version != g.Version || !w.UpdatedAt.Equal(g.UpdatedAt):
			bad = append(bad, fmt.Sprintf("%s: %s v%d at %s, the events make %s v%d at %s", k, g.Status, g.Version,
				g.UpdatedAt.UTC().Format(time.RFC3339Nano), w.Status, w.Version, w.UpdatedAt.UTC().Format(time.RFC3339Nano)))
		}
	}
	er.Effects = len(e.effective)
	rep.check("orders", "order_overview equals the projection of the published events (newest version wins)", len(bad) == 0,
		summarize(bad, fmt.Sprintf("%d orders", len(got))))
	if err := h.checkEffectKeys(ctx, rep, orders, "notify_shipped", shipped); err != nil {
		return err
	}
	var ms struct {
		Received int `json:"received"`
		Distinct int `json:"distinct"`
	}
	if err := getJSON(ctx, h.mailURL+"/stats", &ms); err != nil {
		return err
	}
	rep.check("orders", "the mail stub got one distinct e-mail per shipped order", ms.Distinct == len(shipped),
		fmt.Sprintf("%d distinct e-mails (%d requests) for %d shipped orders", ms.Distinct, ms.Received, len(shipped)))
	return nil
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// summarize is ok when problems is empty, else the first few problems.
func summarize(problems []string, ok string) string {
	if len(problems) == 0 {
		return ok
	}
	const show = 5
	s := strings.Join(problems[:min(show, len(problems))], "; ")
	if len(problems) > show {
		s += fmt.Sprintf("; … %d more", len(problems)-show)
	}
	return s
}

func sortedKeys[A, B any](a map[string]A, b map[string]B) []string {
	set := map[string]bool{}
	for k := range a {
		set[k] = true
	}
	for k := range b {
		set[k] = true
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func describe(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m, map[string]int{}) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
