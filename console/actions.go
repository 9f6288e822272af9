package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpnames"
)

// Actions take the operator from authentication (never from the form),
// require a reason, run through the libraries (which refuse what is
// beyond the horizon and write their audit), are bounded by
// Config.ActionTimeout, and log a line with the operator and the reason.
// "Many" is a loop over the library's one-at-a-time function: a bulk
// function replaces the loop in one place.

// actionLine is what an action did to one thing.
type actionLine struct {
	What    string
	Outcome string
	OK      bool
	Refused bool // the library refused it (the horizon, a concurrent decision)
}

// actionsData is the page that reports an action.
type actionsData struct {
	Action string
	Reason string
	Lines  []actionLine
	Back   string // the path to go back to
}

// reasonOf is the form's reason, required for every action.
func reasonOf(r *http.Request) (string, bool) {
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	return reason, reason != ""
}

// reportAction logs the action and renders its report.
func (c *Console) reportAction(w http.ResponseWriter, r *http.Request, s *session, d actionsData) {
	ok := 0
	for _, l := range d.Lines {
		if l.OK {
			ok++
		}
	}
	c.cfg.Logger.Info("console: "+d.Action, "operator", s.operator, "reason", d.Reason, "items", len(d.Lines), "done", ok)
	c.render(w, r, s, http.StatusOK, "actions", d.Action, d)
}

// redrivePlan is one call of deadletters.Redrive.
type redrivePlan struct {
	what string
	opts deadletters.RedriveOptions
}

// redrive moves dead letters back to their queue: the rows selected (one
// Redrive each, for the row's consumer, message id and reason), or a group
// (one Redrive per queue of the group, for its consumer and reason).
func (c *Console) redrive(w http.ResponseWriter, r *http.Request, s *session) {
	reason, ok := reasonOf(r)
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "a redrive needs a reason, for the log")
		return
	}
	if len(c.cfg.AMQPURLs) == 0 {
		c.refuse(w, r, http.StatusConflict, "no broker is configured (AMQPURLs, --amqp-url): the console cannot redrive")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ActionTimeout)
	defer cancel()
	plans, lines, err := c.redrivePlans(ctx, r)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	for _, p := range plans {
		p.opts.Pool, p.opts.Tables, p.opts.AMQPURLs, p.opts.Operator = c.cfg.Pool, c.cfg.Tables, c.cfg.AMQPURLs, s.operator
		res, err := deadletters.Redrive(ctx, p.opts)
		lines = append(lines, redriveLines(p, res, err)...)
	}
	c.reportAction(w, r, s, actionsData{Action: "Redrive", Reason: reason, Lines: lines, Back: "/deadletters"})
}

// redrivePlans turns the form into Redrive calls: the selected rows
// (id=…), or a group (consumer, dlreason, source=…). Rows already settled
// are reported, not redriven.
func (c *Console) redrivePlans(ctx context.Context, r *http.Request) ([]redrivePlan, []actionLine, error) {
	var (
		plans []redrivePlan
		lines []actionLine
	)
	if ids := r.PostForm["id"]; len(ids) > 0 {
		rows, err := c.store.deadRows(ctx, parseIDs(ids))
		if err != nil {
			return nil, nil, err
		}
		var sources []string
		for _, d := range rows {
			sources = append(sources, d.Source)
		}
		queues := c.redriveQueues(ctx, sources)
		for _, d := range rows {
			what := fmt.Sprintf("dead letter %d: message %s of %s (%s)", d.ID, show(d.MessageID), show(d.Consumer), show(d.Reason))
			if d.Settled() {
				lines = append(lines, actionLine{What: what, Outcome: "already settled: " + show(d.RedrivenBy), Refused: true})
				continue
			}
			plans = append(plans, redrivePlan{what: what, opts: deadletters.RedriveOptions{Queue: queues[d.Source],
				Consumer: d.Consumer, MessageID: d.MessageID, Reason: d.Reason, Limit: 1}})
		}
		return plans, lines, nil
	}
	consumer, why := r.PostForm.Get("consumer"), r.PostForm.Get("dlreason")
	if consumer == "" || why == "" {
		return nil, []actionLine{{What: "nothing selected", Outcome: "select dead letters, or a group", Refused: true}}, nil
	}
	queues := c.redriveQueues(ctx, r.PostForm["source"])
	for _, src := range r.PostForm["source"] {
		plans = append(plans, redrivePlan{
			what: fmt.Sprintf("group %s × %s from %s", show(consumer), show(why), show(src)),
			opts: deadletters.RedriveOptions{Queue: queues[src], Consumer: consumer, Reason: why}})
	}
	return plans, nil, nil
}

// redriveLines reports one Redrive: what moved, and each refusal with why.
func redriveLines(p redrivePlan, res deadletters.RedriveResult, err error) []actionLine {
	dlq := deadletters.QueueName(p.opts.Queue)
	out := []actionLine{{What: p.what, OK: err == nil && res.Moved > 0,
		Outcome: fmt.Sprintf("moved %d of %d looked at from %s back to %s; %d dead-letter rows marked",
			res.Moved, res.Scanned, dlq, p.opts.Queue, res.Marked)}}
	switch {
	case err != nil && !errors.Is(err, inbox.ErrBeyondHorizon):
		out[0].Outcome += "; failed: " + err.Error()
	case err == nil && res.Moved == 0:
		out[0].Outcome += ": no matching message in " + dlq
	}
	for _, ref := range res.Refusals {
		out = append(out, actionLine{What: "message " + show(ref.MessageID) + " of " + show(ref.Consumer), Refused: true,
			Outcome: "refused, left in " + dlq + ": " + ref.Err.Error()})
	}
	if more := res.Refused - len(res.Refusals); more > 0 {
		out = append(out, actionLine{What: fmt.Sprintf("%d more", more), Refused: true, Outcome: "refused, left in " + dlq})
	}
	return out
}

// redriveQueues maps each source (the queue a dead letter came from) to
// the queue Redrive takes: the source itself, or for a partition queue
// (QUEUE.pN) whose consumer's exchange QUEUE exists, QUEUE: Redrive sends
// each message back through it to its partition. Without an answer from
// the broker, the source.
func (c *Console) redriveQueues(ctx context.Context, sources []string) map[string]string {
	out := map[string]string{}
	var partitioned []string
	for _, src := range sources {
		out[src] = src
		if partitionQueue.MatchString(src) {
			partitioned = append(partitioned, src)
		}
	}
	if len(partitioned) == 0 {
		return out
	}
	conn, err := amqpconn.Dial(ctx, c.cfg.AMQPURLs, "idem-console", probeTimeout)
	if err != nil {
		return out
	}
	defer func() { _ = conn.Close() }()
	for _, src := range partitioned {
		base := baseQueue(src)
		var ch interface{ Close() error }
		err := conn.Call(func() error {
			channel, err := conn.Channel()
			if err != nil {
				return err
			}
			ch = channel
			return channel.ExchangeDeclarePassive(amqpnames.PartitionExchange(base), amqpnames.PartitionExchangeType,
				true, false, false, false, nil)
		})
		if err == nil {
			out[src] = base
			_ = conn.Call(ch.Close)
		}
	}
	return out
}

// parseIDs reads row ids, skipping what is not one.
func parseIDs(in []string) []int64 {
	var out []int64
	for _, s := range in {
		if id, err := strconv.ParseInt(s, 10, 64); err == nil && id > 0 {
			out = append(out, id)
		}
	}
	return out
}

// discardedPrefix starts redriven_by on a discarded row.
const discardedPrefix = "discarded by "

// discard settles dead letters an operator decided never to redrive. No
// library function does it, and the dead-letter table has no column for
// it: the console takes the marking Redrive writes (redriven_at, and
// redriven_by = "discarded by <operator>: <reason>"), which every reader
// of the row sees and which makes a later Redrive leave the message's copy
// in the dead-letter queue (its row is settled). Nothing is deleted: the
// row stays, and so does the copy in the dead-letter queue.
func (c *Console) discard(w http.ResponseWriter, r *http.Request, s *session) {
	reason, ok := reasonOf(r)
	if !ok {
		c.refuse(w, r, http.StatusBadRequest, "a discard needs a reason, for the dead-letter row and the log")
		return
	}
	ids := parseIDs(r.PostForm["id"])
	if len(ids) == 0 {
		c.refuse(w, r, http.StatusBadRequest, "select the dead letters to discard")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ActionTimeout)
	defer cancel()
	marked, err := c.store.discard(ctx, ids, discardedPrefix+s.operator+": "+reason)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var lines []actionLine
	for _, id := range ids {
		what := "dead letter " + strconv.FormatInt(id, 10)
		if marked[id] {
			lines = append(lines, actionLine{What: what, OK: true, Outcome: "discarded; its copy stays in the dead-letter queue"})
		} else {
			lines = append(lines, actionLine{What: what, Refused: true, Outcome: "not discarded: it is already redriven or discarded, or gone"})
		}
	}
	c.reportAction(w, r, s, actionsData{Action: "Discard", Reason: reason, Lines: lines, Back: "/deadletters"})
}

// discard marks the rows ids discarded with note, those not settled yet,
// and returns which it marked. Console statement: see Console.discard.
func (s *store) discard(ctx context.Context, ids []int64, note string) (map[int64]bool, error) {
	rows, err := s.pool.Query(ctx, s.sql.discard, ids, note)
	if err != nil {
		return nil, fmt.Errorf("discard: %w", err)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("discard: %w", err)
	}
	out := map[int64]bool{}
	for _, id := range marked {
		out[id] = true
	}
	return out, nil
}
