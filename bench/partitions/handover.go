package main

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// handoverResult is one handover run: a process killed while the others
// and it consumed events published at a steady rate.
type handoverResult struct {
	round      int
	victim     string
	relocked   time.Duration  // from the kill until the survivors held every partition's lock
	parts      []partHandover // the victim's partitions at the kill
	events     int            // distinct events published
	once       int
	applied    int
	violations int
	perLabel   map[string]int
}

// partHandover is one of the victim's partitions: who took it, and the time
// from the kill to the first event of it that process applied.
type partHandover struct {
	part string
	took string
	gap  time.Duration
}

// max is the longest handover of the victim's partitions.
func (h handoverResult) max() time.Duration {
	var m time.Duration
	for _, p := range h.parts {
		m = max(m, p.gap)
	}
	return m
}

// handover runs -procs worker processes of a fresh partitioned consumer,
// publishes events at -rate per second, kills the process w2 with SIGKILL
// after -before (once every process applies events), publishes for -after
// more, then waits until every event is applied and measures.
func (b *bench) handover(ctx context.Context, round int) (handoverResult, error) {
	h := handoverResult{round: round, victim: "w2"}
	q := fmt.Sprintf("bench.partitions.%s.handover.r%d", b.runID, round)
	t, err := b.declare(ctx, q, b.o.partitions)
	if err != nil {
		return h, err
	}
	defer t.remove()
	if err := b.resetTables(ctx); err != nil {
		return h, err
	}
	p, err := newPublisher(b.o, t)
	if err != nil {
		return h, err
	}
	defer p.close()
	ws, err := b.startWorkers(q, b.o.partitions, b.o.procs)
	if err != nil {
		return h, err
	}
	defer ws.kill()

	stop := make(chan struct{})
	published := make(chan error, 1)
	go func() { // owned by handover: ends when stop is closed
		n, err := p.publishAt(ctx, newEvents(b.o, uint64(100+round)), b.o.rate, stop)
		h.events = n
		published <- err
	}()
	stopPublishing := func() error {
		if stop == nil {
			return nil
		}
		close(stop)
		stop = nil
		return <-published
	}
	defer stopPublishing() //nolint:errcheck // after an error

	time.Sleep(b.o.before)
	if _, err := b.waitSettled(ctx, ws.labels, b.o.partitions); err != nil {
		return h, err
	}
	if err := b.waitEveryLabelApplying(ctx, ws.labels); err != nil {
		return h, err
	}
	victim := ws.cmds[slices.Index(ws.labels, h.victim)]
	killAt := time.Now()
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		return h, err
	}
	_ = victim.Wait()
	survivors := slices.DeleteFunc(slices.Clone(ws.labels), func(l string) bool { return l == h.victim })
	reheld, err := b.waitSettled(ctx, survivors, b.o.partitions)
	if err != nil {
		return h, err
	}
	h.relocked = reheld.Sub(killAt)
	time.Sleep(b.o.after - time.Since(killAt))
	if err := stopPublishing(); err != nil {
		return h, err
	}
	if err := b.waitApplied(ctx, h.events, t); err != nil {
		return h, err
	}
	if _, _, err := ws.stop(); err != nil {
		return h, err
	}
	d := drainResult{n: h.events}
	if err := b.check(ctx, &d); err != nil {
		return h, err
	}
	h.once, h.applied, h.violations, h.perLabel = d.once, d.applied, d.violations, d.perLabel
	h.parts, err = b.handovers(ctx, h.victim, killAt)
	if err == nil && h.violations > 0 {
		b.logViolations(ctx, killAt)
	}
	return h, err
}

// logViolations logs the first events applied out of order: which process
// applied each, from which partition, whether the broker redelivered it,
// when (from the kill), and the same of the event that should have come
// before it.
func (b *bench) logViolations(ctx context.Context, killAt time.Time) {
	s := b.tables.QuotedSchema()
	rows, err := b.pool.Query(ctx, `
		SELECT v.account, v.seq, v.after, a.label, a.part, a.redelivered, a.at, p.label, p.part, p.redelivered, p.at
		FROM `+s+`.violations v
		JOIN `+s+`.applied a ON a.message_id = v.account || '/' || v.seq
		LEFT JOIN `+s+`.applied p ON p.message_id = v.account || '/' || (v.after + 1)
		ORDER BY a.at LIMIT 20`)
	if err != nil {
		logf("violations: %v", err)
		return
	}
	var account, seq, after int
	var label, part string
	var redelivered bool
	var at time.Time
	var plabel, ppart *string
	var predelivered *bool
	var pat *time.Time
	_, err = pgx.ForEachRow(rows, []any{&account, &seq, &after, &label, &part, &redelivered, &at, &plabel, &ppart, &predelivered, &pat}, func() error {
		prev := "none"
		if plabel != nil {
			prev = fmt.Sprintf("%s %s redelivered=%v at %v", *plabel, *ppart, *predelivered, pat.Sub(killAt).Round(time.Millisecond))
		}
		logf("out of order: account %d seq %d after %d: %s %s redelivered=%v at %v (seq after+1: %s)", account, seq, after,
			label, part, redelivered, at.Sub(killAt).Round(time.Millisecond), prev)
		return nil
	})
	if err != nil {
		logf("violations: %v", err)
	}
}

// waitEveryLabelApplying waits until each process applied an event in the
// last half second: the lease has given each its share.
func (b *bench) waitEveryLabelApplying(ctx context.Context, labels []string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT label) FROM `+b.tables.QuotedSchema()+`.applied
			WHERE at > clock_timestamp() - interval '500 milliseconds'`).Scan(&n)
		if err != nil {
			return err
		}
		if n == len(labels) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d processes applying events after a minute", n, len(labels))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// handovers finds the victim's partitions at killAt (those whose last event
// applied before it was the victim's) and, for each, the first event a
// survivor applied after killAt.
func (b *bench) handovers(ctx context.Context, victim string, killAt time.Time) ([]partHandover, error) {
	s := b.tables.QuotedSchema()
	rows, err := b.pool.Query(ctx, `
		WITH owner AS (
			SELECT DISTINCT ON (part) part, label FROM `+s+`.applied WHERE at < $2 ORDER BY part, at DESC)
		SELECT o.part, f.label, f.at
		FROM owner o
		LEFT JOIN LATERAL (SELECT label, at FROM `+s+`.applied a WHERE a.part = o.part AND a.at > $2
			ORDER BY at LIMIT 1) f ON true
		WHERE o.label = $1
		ORDER BY o.part`, victim, killAt)
	if err != nil {
		return nil, err
	}
	var out []partHandover
	var part string
	var took *string
	var at *time.Time
	_, err = pgx.ForEachRow(rows, []any{&part, &took, &at}, func() error {
		if took == nil {
			return fmt.Errorf("partition %s: no event applied after the kill", part)
		}
		out = append(out, partHandover{part: part, took: *took, gap: at.Sub(killAt)})
		return nil
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("no partition of %s found taken over", victim)
	}
	return out, err
}
