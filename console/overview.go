package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/amqpnames"
)

// The overview counts the last hour from the database: the inbox rows
// received in it (processed), those of them a later copy was claimed for
// (duplicates), the dead letters and the payload conflicts among them. Each
// count reads at most recentCap rows through a time index; past that it
// says "at least" and how far back it reached.

// recentWindow is how far back the overview counts.
const recentWindow = time.Hour

// recentCap bounds the rows each of the overview's counts reads.
const recentCap = 10000

// maxOverviewConsumers bounds the consumers the overview details.
const maxOverviewConsumers = 50

// consumerView is one consumer's line on the overview.
type consumerView struct {
	Name       string
	Sources    []string
	Processed  count
	Duplicates count
	Dead       count
	Conflicts  count
	Horizons   []inbox.Horizon
}

// windowNote says how far a bounded count reached.
type windowNote struct {
	Full    bool      // it read recentCap rows: its counts are lower bounds
	Reached time.Time // the oldest row it read
}

// queueView is one queue's depth on the overview.
type queueView struct {
	Queue, Retry, DeadLetter queueDepth
}

// streamView is one stream checkpoint.
type streamView struct {
	Consumer, Stream string
	Offset           int64
	At               time.Time
}

// overviewData is the overview page.
type overviewData struct {
	Since           time.Time
	Consumers       []consumerView
	MoreConsumers   bool
	InboxWindow     windowNote
	DeadWindow      windowNote
	Broker          brokerView
	Queues          []queueView
	Streams         []streamView
	Health          []health.Status
	Leases          []leaseView
	DeadLetters     count
	Effects         count
	NewestTombstone time.Time
}

// overview is the first screen: what each consumer did in the last hour,
// the queues, the streams, retention, readiness and partitions.
func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	d, sources, err := c.store.activity(ctx, time.Now().Add(-recentWindow))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if err := c.store.horizons(ctx, d.Consumers); err != nil {
		c.fail(w, r, err)
		return
	}
	if d.Streams, err = c.store.streams(ctx); err != nil {
		c.fail(w, r, err)
		return
	}
	if err := c.store.sizes(ctx, &d); err != nil {
		c.fail(w, r, err)
		return
	}
	if d.Leases, err = c.store.leases(ctx, candidates(sources)); err != nil {
		c.fail(w, r, err)
		return
	}
	for _, h := range c.cfg.Health {
		d.Health = append(d.Health, h.Health())
	}
	d.Queues, d.Broker = c.queueDepths(ctx, sources, d.Streams)
	c.render(w, r, s, http.StatusOK, "overview", "Overview", d)
}

// activity counts the last hour per consumer and returns the sources each
// consumer was seen on.
func (s *store) activity(ctx context.Context, since time.Time) (overviewData, map[string][]string, error) {
	d := overviewData{Since: since}
	byName := map[string]*consumerView{}
	sources := map[string][]string{}
	get := func(name, source string) *consumerView {
		cv := byName[name]
		if cv == nil {
			cv = &consumerView{Name: name}
			byName[name] = cv
		}
		if source != "" && !slices.Contains(cv.Sources, source) {
			cv.Sources = append(cv.Sources, source)
			sources[name] = append(sources[name], source)
		}
		return cv
	}
	in, err := s.window(ctx, s.sql.recentInbox, since, func(name, source string, all, some int64) {
		cv := get(name, source)
		cv.Processed.N += all
		cv.Duplicates.N += some
	})
	if err != nil {
		return d, nil, fmt.Errorf("recent inbox rows: %w", err)
	}
	dead, err := s.window(ctx, s.sql.recentDead, since, func(name, source string, all, some int64) {
		cv := get(name, source)
		cv.Dead.N += all
		cv.Conflicts.N += some
	})
	if err != nil {
		return d, nil, fmt.Errorf("recent dead letters: %w", err)
	}
	d.InboxWindow, d.DeadWindow = in, dead
	for _, table := range []string{"inbox", "dead_letters"} {
		names, err := s.consumers(ctx, table)
		if err != nil {
			return d, nil, err
		}
		for _, n := range names {
			if !scope(n) {
				get(n, "")
			}
		}
	}
	d.Consumers = sortedConsumers(byName, in.Full, dead.Full)
	if len(d.Consumers) > maxOverviewConsumers {
		d.Consumers, d.MoreConsumers = d.Consumers[:maxOverviewConsumers], true
	}
	return d, sources, nil
}

// scope reports whether name is a replay's or a rebuild's inbox scope,
// shown with its run rather than as a consumer.
func scope(name string) bool {
	return strings.Contains(name, "@rebuild:") || strings.Contains(name, "@replay:")
}

// sortedConsumers orders the consumers by name, their counts marked as
// lower bounds where the windows were full.
func sortedConsumers(byName map[string]*consumerView, inFull, deadFull bool) []consumerView {
	out := make([]consumerView, 0, len(byName))
	for _, cv := range byName {
		if inFull {
			cv.Processed.Kind, cv.Duplicates.Kind = atLeast, atLeast
		}
		if deadFull {
			cv.Dead.Kind, cv.Conflicts.Kind = atLeast, atLeast
		}
		slices.Sort(cv.Sources)
		out = append(out, *cv)
	}
	slices.SortFunc(out, func(a, b consumerView) int { return cmpString(a.Name, b.Name) })
	return out
}

// window runs one of the recent* queries and hands each row to add.
func (s *store) window(ctx context.Context, sql string, since time.Time,
	add func(consumer, source string, all, some int64)) (windowNote, error) {
	rows, err := s.pool.Query(ctx, sql, since, recentCap)
	if err != nil {
		return windowNote{}, err
	}
	defer rows.Close()
	var (
		note  windowNote
		total int64
	)
	for rows.Next() {
		var (
			consumer, source string
			all, some        int64
			oldest           time.Time
		)
		if err := rows.Scan(&consumer, &source, &all, &some, &oldest); err != nil {
			return note, err
		}
		total += all
		if note.Reached.IsZero() || oldest.Before(note.Reached) {
			note.Reached = oldest
		}
		if !scope(consumer) {
			add(consumer, source, all, some)
		}
	}
	note.Full = total >= recentCap
	return note, rows.Err()
}

// recentSources returns the sources each consumer was seen on in the last
// hour.
func (s *store) recentSources(ctx context.Context) (map[string][]string, error) {
	_, sources, err := s.activity(ctx, time.Now().Add(-recentWindow))
	return sources, err
}

// horizons fills each consumer's inbox horizons (inbox.Inbox.Horizons):
// what retention made it forget, and when retention last deleted its rows.
func (s *store) horizons(ctx context.Context, consumers []consumerView) error {
	for i := range consumers {
		hs, err := s.inbox.Horizons(ctx, s.pool, consumers[i].Name)
		if err != nil {
			return err
		}
		consumers[i].Horizons = hs
	}
	return nil
}

// streams lists the live consumers' stream checkpoints. Console query: no
// library function lists them. The lag behind the stream's tail would need
// the stream protocol; the checkpoint's age says whether it moves.
func (s *store) streams(ctx context.Context) ([]streamView, error) {
	rows, err := s.pool.Query(ctx, s.sql.checkpoints, maxConsumers)
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (streamView, error) {
		var v streamView
		err := r.Scan(&v.Consumer, &v.Stream, &v.Offset, &v.At)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	return out, nil
}

// sizes fills the sizes of the two large tables (estimated above
// countThreshold) and when ledger retention last ran.
func (s *store) sizes(ctx context.Context, d *overviewData) error {
	var err error
	if d.DeadLetters, err = s.tableSize(ctx, "dead_letters"); err != nil {
		return err
	}
	if d.Effects, err = s.tableSize(ctx, "ledger"); err != nil {
		return err
	}
	var at *time.Time
	if err := s.pool.QueryRow(ctx, s.sql.newestTombstone).Scan(&at); err != nil {
		return fmt.Errorf("ledger tombstones: %w", err)
	}
	if at != nil {
		d.NewestTombstone = *at
	}
	return nil
}

// tableSize is a table's row count: exact when the planner thinks it
// small, else the planner's figure.
func (s *store) tableSize(ctx context.Context, table string) (count, error) {
	n, err := s.tableRows(ctx, table)
	if err != nil {
		return count{}, err
	}
	if n > countThreshold*10 {
		return count{N: n, Kind: estimated}, nil
	}
	var exactN int64
	err = s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s LIMIT %d) AS x`,
		s.cfg.Tables.Table(table), countThreshold*10+1)).Scan(&exactN)
	if err != nil {
		return count{}, fmt.Errorf("size of %s: %w", table, err)
	}
	if exactN > countThreshold*10 {
		return count{N: max(n, exactN), Kind: estimated}, nil
	}
	return count{N: exactN}, nil
}

// queueDepths probes the queues of the sources the consumers were seen on
// (and Config.Queues): each queue with its retry queue and its dead-letter
// queue. Streams are not queues: their checkpoints say how far they are.
func (c *Console) queueDepths(ctx context.Context, sources map[string][]string, streams []streamView) ([]queueView, brokerView) {
	isStream := map[string]bool{}
	for _, s := range streams {
		isStream[s.Stream] = true
	}
	seen := map[string]bool{}
	var queues []string
	for _, list := range sources {
		for _, q := range list {
			if !isStream[q] && !seen[q] {
				seen[q] = true
				queues = append(queues, q)
			}
		}
	}
	for _, q := range c.cfg.Queues {
		if !seen[q] {
			seen[q] = true
			queues = append(queues, q)
		}
	}
	slices.Sort(queues)
	var views []queueView
	var names []string
	for _, q := range queues {
		v := queueView{Queue: queueDepth{Name: q}, Retry: queueDepth{Name: amqpnames.RetryQueue(q)},
			DeadLetter: queueDepth{Name: amqpnames.DeadLetterQueue(baseQueue(q))}}
		views = append(views, v)
		names = append(names, v.Queue.Name, v.Retry.Name, v.DeadLetter.Name)
	}
	b := c.broker.depths(ctx, slices.Compact(slices.Sorted(slices.Values(names))))
	for i := range views {
		for _, d := range []*queueDepth{&views[i].Queue, &views[i].Retry, &views[i].DeadLetter} {
			if got, ok := b.Queues[d.Name]; ok {
				*d = got
			}
		}
	}
	return views, b
}

// baseQueue is the consumer's queue of a partition queue (its dead-letter
// queue is the one of the whole consumer), or q itself.
func baseQueue(q string) string {
	if m := partitionQueue.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	return q
}
