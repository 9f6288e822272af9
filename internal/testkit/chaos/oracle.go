package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/ledger"
)

// Invariants the oracle checks, as the report names them.
const (
	invExactlyOnce   = "exactly_once"          // every intended message applied once, or refused with a reason
	invConflictLoud  = "conflict_loud"         // a second payload under an id is a payload_conflict dead letter
	invEffectOnce    = "effect_at_most_once"   // the non-deduplicating gateway charged each key at most once
	invMaybeHappened = "effect_maybe_happened" // a charge that happened is succeeded or unknown
	invEffectBound   = "effect_of_applied"     // an applied charge message has one effect; no other has any
	invKeyOrder      = "key_order"             // one key's messages applied once each, in publish order
	invNothingLost   = "nothing_lost"          // every publish applied, a duplicate, or dead-lettered
	invDeadLetters   = "dead_letter_rows"      // every dead letter has a row with a known reason, and a copy in its queue
	invDrain         = "queues_drain"          // queues empty and effects settled within the settle time
	invReadiness     = "readiness_outage"      // readiness reports every PostgreSQL outage
	invWorkersUp     = "workers_stay_up"       // no worker exits unless killed
	invPartOrder     = "partition_key_order"   // one key of the partitioned queue applied once each, in publish order, while processes join and leave
	invUndecodable   = "undecodable_alone"     // a message the client cannot decode is dead-lettered (row, reason undecodable) within 30s, alone
	invEdgeKill      = "edge_kill_retry"       // a request whose edge process died under it is done once its client retries: never lost, never twice
	invExpired       = "http_key_expired"      // a key past its expiry is refused 422 IDEMPOTENCY_KEY_EXPIRED and its handler does not run again
	invHTTPOnce      = "http_key_once"         // one Idempotency-Key runs its handler once, with its first body; every 2xx is the same stored answer
)

// expectedReasons are the dead-letter reasons a schedule can cause.
var expectedReasons = []string{deadletters.ReasonPayloadConflict, reasonDecode, deadletters.ReasonMissingMessageID, deadletters.ReasonTooLarge,
	deadletters.ReasonUndecodable, reasonEffectConflict}

// settleFor bounds how long the workers get, once the schedule is done, to
// drain the queues and settle the effects.
const settleFor = 60 * time.Second

// state is what the tables and queues hold.
type state struct {
	applied  map[string][]int64         // by message id: amounts applied
	http     map[string][]int64         // by Idempotency-Key: amounts the edge's handler applied
	ordered  map[string][]int           // by key: seqs applied, in order
	part     map[string][]int           // by key of the partitioned queue: seqs applied, in order
	dead     map[string]map[string]int  // by consumer, then reason: rows
	deadIDs  map[string]map[string]bool // main consumer: id → reasons
	waiting  map[string]int             // by consumer: rows not redriven
	effects  []effectRow
	stream   map[string]int64 // by stream message id: applications of any mode
	queued   map[string]int   // by queue: messages ready
	unsettle int              // effects pending, in flight or retryable
}

// effectRow is an effect of the ledger, or the tombstone of one
// retention deleted (status "tombstone", no message id).
type effectRow struct {
	id, messageID, key, status string
}

// settle waits until the queues are empty, every publish is accounted for
// and every effect is settled (twice in a row), or settleFor passes.
func (r *runner) settle(ctx context.Context) {
	deadline := time.Now().Add(settleFor)
	streak := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s, err := r.read(ctx)
		if err == nil && r.accounted(s) == "" {
			if streak++; streak == 2 {
				r.obs.note(func(o *observations) { o.settled = true })
				return
			}
		} else {
			streak = 0
		}
		time.Sleep(300 * time.Millisecond)
	}
	s, err := r.read(ctx)
	why := fmt.Sprint(err)
	if err == nil {
		why = r.accounted(s)
	}
	r.obs.note(func(o *observations) { o.settleReason = why })
}

// accounted says what is still open, or "" when nothing is.
func (r *runner) accounted(s *state) string {
	for q, n := range s.queued {
		if n > 0 {
			return fmt.Sprintf("%d messages ready in %s", n, q)
		}
	}
	if s.unsettle > 0 {
		return fmt.Sprintf("%d effects pending, in flight or retryable", s.unsettle)
	}
	for id := range r.model.amounts {
		if len(s.applied[id]) == 0 && len(s.deadIDs[id]) == 0 {
			return fmt.Sprintf("message %s neither applied nor dead-lettered", id)
		}
	}
	for key, seqs := range r.model.keyedSeqs {
		if len(s.ordered[key])+s.dead[orderedConsumer][deadletters.ReasonMaxAttempts] < len(seqs) {
			return fmt.Sprintf("key %s: %d of %d applied", key, len(s.ordered[key]), len(seqs))
		}
	}
	for key, seqs := range r.model.partSeqs {
		if len(s.part[key])+s.dead[partConsumer][deadletters.ReasonMaxAttempts] < len(seqs) {
			return fmt.Sprintf("partitioned key %s: %d of %d applied", key, len(s.part[key]), len(seqs))
		}
	}
	for reason, n := range r.model.refusals {
		if s.dead[mainConsumer][reason] < n {
			return fmt.Sprintf("%d of %d %s dead letters", s.dead[mainConsumer][reason], n, reason)
		}
	}
	for _, d := range r.model.stream {
		if s.stream[d.id] == 0 {
			return fmt.Sprintf("stream message %s not applied", d.id)
		}
	}
	return ""
}

// read reads the tables and the queues.
func (r *runner) read(ctx context.Context) (*state, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s := &state{applied: map[string][]int64{}, http: map[string][]int64{}, ordered: map[string][]int{}, part: map[string][]int{}, dead: map[string]map[string]int{},
		deadIDs: map[string]map[string]bool{}, waiting: map[string]int{}, queued: map[string]int{}}
	// The queues first: a dead letter's row commits before its copy is
	// published, so every copy counted here has its row by the time the
	// rows are read, even while a redelivered message is dead-lettered
	// again (its delivery, unacked, is not among the ready messages that
	// settle waits for).
	if err := r.readQueues(s); err != nil {
		return nil, err
	}
	q := r.tables.QuotedSchema()
	for _, err := range []error{
		readLists(ctx, r.pool, `SELECT message_id, amount FROM `+q+`.chaos_applied ORDER BY n`, s.applied),
		readLists(ctx, r.pool, `SELECT key, seq FROM `+q+`.chaos_ordered ORDER BY n`, s.ordered),
		readLists(ctx, r.pool, `SELECT key, seq FROM `+q+`.chaos_part ORDER BY n`, s.part),
		readLists(ctx, r.pool, `SELECT key, amount FROM `+q+`.chaos_http ORDER BY n`, s.http),
	} {
		if err != nil {
			return nil, err
		}
	}
	if err := r.readDead(ctx, s); err != nil {
		return nil, err
	}
	var err error
	if s.stream, err = queryMap(ctx, r.pool, `SELECT message_id, count(*) FROM `+q+`.chaos_stream_log GROUP BY message_id`); err != nil {
		return nil, err
	}
	if err := r.readEffects(ctx, s); err != nil {
		return nil, err
	}
	return s, nil
}

// readLists reads the rows (key, value) of sql into lists, in order.
func readLists[V any](ctx context.Context, pool *pgxpool.Pool, sql string, lists map[string][]V) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var v V
		if err := rows.Scan(&key, &v); err != nil {
			return err
		}
		lists[key] = append(lists[key], v)
	}
	return rows.Err()
}

// deadRow is a dead-letter row as last seen: a cleanup may delete it
// since, its copy staying in the dead-letter queue.
type deadRow struct {
	consumer, id, reason string
	waiting              bool
}

// readDead reads the dead-letter rows, with those seen before a cleanup
// deleted them.
func (r *runner) readDead(ctx context.Context, s *state) error {
	rows, err := r.pool.Query(ctx, `SELECT id, consumer, message_id, reason, redriven_at IS NULL FROM `+r.tables.Table("dead_letters"))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var d deadRow
		if err := rows.Scan(&n, &d.consumer, &d.id, &d.reason, &d.waiting); err != nil {
			return err
		}
		r.deadSeen[n] = d
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, d := range r.deadSeen {
		consumer, id, reason, waiting := d.consumer, d.id, d.reason, d.waiting
		if s.dead[consumer] == nil {
			s.dead[consumer] = map[string]int{}
		}
		s.dead[consumer][reason]++
		if waiting {
			s.waiting[consumer]++
		}
		if consumer == mainConsumer {
			if s.deadIDs[id] == nil {
				s.deadIDs[id] = map[string]bool{}
			}
			s.deadIDs[id][reason] = true
		}
	}
	return nil
}

func (r *runner) readEffects(ctx context.Context, s *state) error {
	rows, err := r.pool.Query(ctx, `SELECT effect_id, message_id, idempotency_key, status FROM `+r.tables.Table("ledger")+`
		UNION ALL SELECT effect_id, '', idempotency_key, 'tombstone' FROM `+r.tables.Table("ledger_tombstones"))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var e effectRow
		if err := rows.Scan(&e.id, &e.messageID, &e.key, &e.status); err != nil {
			return err
		}
		if slices.Contains([]string{"pending", "in_flight", "failed_retryable"}, e.status) {
			s.unsettle++
		}
		s.effects = append(s.effects, e)
	}
	return rows.Err()
}

// readQueues counts the ready messages of the work queues and the
// dead-letter queues.
func (r *runner) readQueues(s *state) error {
	conn, err := r.dialAMQP(context.Background())
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, base := range []string{r.queue, r.ordered} {
		for _, name := range []string{base, base + ".retry", deadletters.QueueName(base)} {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				return fmt.Errorf("chaos: queue %s: %w", name, err)
			}
			_ = ch.Close()
			if name == deadletters.QueueName(base) {
				s.queued["dlq:"+base] = 0
				s.waiting["dlq:"+base] = qi.Messages
				continue
			}
			s.queued[name] = qi.Messages
		}
	}
	return nil
}

// check reads the final state and checks every invariant into rep.
func (r *runner) check(ctx context.Context, rep *report) {
	r.obs.mu.Lock()
	obs := observations{outages: r.obs.outages, outagesSeen: r.obs.outagesSeen, exits: slices.Clone(r.obs.exits),
		settled: r.obs.settled, settleReason: r.obs.settleReason, checks: slices.Clone(r.obs.checks)}
	r.obs.mu.Unlock()
	for _, c := range obs.checks {
		rep.expect(c.inv, c.ok, "%s", c.why)
	}
	rep.expect(invDrain, obs.settled, "not settled within %s: %s", settleFor, obs.settleReason)
	for i := 0; i < obs.outages; i++ {
		rep.expect(invReadiness, i < obs.outagesSeen, "readiness stayed ready through a PostgreSQL outage (%d of %d seen)", obs.outagesSeen, obs.outages)
	}
	for _, e := range obs.exits {
		rep.expect(invWorkersUp, false, "worker exited unasked: %s", e)
	}
	rep.expect(invWorkersUp, len(obs.exits) == 0, "")
	s, err := r.read(ctx)
	if err != nil {
		rep.expect(invDrain, false, "reading the final state: %v", err)
		return
	}
	r.checkMessages(s, rep)
	r.checkEffects(s, rep)
	r.checkKeys(s, rep)
	r.checkPartitions(s, rep)
	if rep.Doors == nil {
		rep.Doors = map[string]int{}
	}
	if n, err := queryMap(ctx, r.pool, `SELECT by, count(*) FROM `+r.tables.QuotedSchema()+`.chaos_part GROUP BY by`); err == nil {
		for by, k := range n {
			rep.Doors["partitioned messages applied by "+by] += int(k)
		}
	}
	r.checkDeadLetters(s, rep)
	r.checkEdge(s, rep)
	r.checkStream(ctx, rep)
	r.checkUndecodable(s, rep)
}

// checkUndecodable: every undecodable message has its dead letter; no
// other message was dead-lettered as undecodable.
func (r *runner) checkUndecodable(s *state, rep *report) {
	n := r.model.refusals[deadletters.ReasonUndecodable]
	if n == 0 {
		return
	}
	rep.expect(invUndecodable, s.dead[mainConsumer][deadletters.ReasonUndecodable] >= n, "%d undecodable messages published, %d dead letters",
		n, s.dead[mainConsumer][deadletters.ReasonUndecodable])
	for id, reasons := range s.deadIDs {
		if reasons[deadletters.ReasonUndecodable] {
			_, deposit := r.model.amounts[id]
			rep.expect(invUndecodable, !deposit, "deposit %s, which the workers can decode, dead-lettered as undecodable", id)
		}
	}
	for id, redriven := range r.model.undecodable {
		// Redriven, its copy (its body, without the header table) is a
		// deposit of amount 1: applied once at most.
		ok := len(s.applied[id]) == 0 || (redriven && len(s.applied[id]) == 1 && s.applied[id][0] == 1)
		rep.expect(invUndecodable, ok, "undecodable message %s applied %v (redriven: %v)", id, s.applied[id], redriven)
	}
}

// checkEdge checks the HTTP edge: each key ran its handler at most once;
// every 2xx a key got is the one stored answer, for the body that ran.
func (r *runner) checkEdge(s *state, rep *report) {
	for _, key := range sortedKeys(r.model.keyAmount) {
		rows := s.http[key]
		rep.expect(invHTTPOnce, len(rows) <= 1, "key %s ran its handler %d times (amounts %v)", key, len(rows), rows)
		first := ""
		for _, a := range r.model.answers[key] {
			if a.status < 200 || a.status > 299 {
				continue
			}
			ok := len(rows) == 1 && rows[0] == a.amount && (first == "" || a.body == first)
			rep.expect(invHTTPOnce, ok, "key %s: %d %q for amount %d; applied %v, first answer %q", key, a.status, a.body, a.amount, rows, first)
			if first == "" {
				first = a.body
			}
		}
	}
}

func (r *runner) checkMessages(s *state, rep *report) {
	m := r.model
	for _, id := range sortedKeys(m.amounts) {
		applied := s.applied[id]
		refused := len(s.deadIDs[id]) > 0
		rep.expect(invNothingLost, len(applied) > 0 || refused, "message %s neither applied nor dead-lettered", id)
		if m.forgotten[id] {
			// A cleanup forgot its inbox row: a copy published later is new
			// to the inbox (the horizon's contract), never more than once.
			copies := 0
			for _, n := range m.amounts[id] {
				copies += n
			}
			rep.expect(invExactlyOnce, len(applied) <= copies, "message %s (forgotten by a cleanup) applied %d times, published %d", id, len(applied), copies)
			continue
		}
		rep.expect(invExactlyOnce, len(applied) <= 1, "message %s applied %d times (amounts %v)", id, len(applied), applied)
		if len(applied) == 0 {
			continue
		}
		_, published := m.amounts[id][applied[0]]
		rep.expect(invExactlyOnce, published, "message %s applied with amount %d, never published", id, applied[0])
		others := 0
		for amount, n := range m.amounts[id] {
			if amount != applied[0] {
				others += n
			}
		}
		if others > 0 && !m.forgotten[id] {
			rep.expect(invConflictLoud, s.deadIDs[id][deadletters.ReasonPayloadConflict],
				"message %s: %d publishes with another payload, no payload_conflict dead letter", id, others)
		}
	}
	for _, id := range sortedKeys(s.applied) {
		_, known := m.amounts[id]
		_, undecodable := m.undecodable[id] // sent back by a redrive: checkUndecodable
		rep.expect(invExactlyOnce, known || undecodable, "applied under id %q, which no publish has (%d times)", id, len(s.applied[id]))
	}
	for reason, n := range m.refusals {
		rep.expect(invNothingLost, s.dead[mainConsumer][reason] >= n, "%d bad messages of reason %s published, %d dead letters", n, reason, s.dead[mainConsumer][reason])
	}
}

func (r *runner) checkEffects(s *state, rep *report) {
	charged := r.gw.snapshot()
	for _, key := range sortedKeys(charged) {
		rep.expect(invEffectOnce, charged[key] <= 1, "the gateway charged key %s %d times", key, charged[key])
	}
	byID := map[string]int{}
	for _, e := range s.effects {
		byID[e.id]++
		if charged[e.key] > 0 {
			// suppressed: recorded again after retention, it settled before.
			rep.expect(invMaybeHappened, slices.Contains([]string{"succeeded", "unknown", "suppressed", "tombstone"}, e.status),
				"effect %s was charged, its effect is %s", e.id, e.status)
		}
		if e.messageID != "" {
			rep.expect(invEffectBound, len(s.applied[e.messageID]) > 0 || s.stream[e.messageID] > 0, "effect of message %s, which was never applied", e.messageID)
		}
	}
	for _, id := range sortedKeys(r.model.charges) {
		if len(s.applied[id]) > 0 || s.stream[id] > 0 {
			eid := ledger.EffectID(chargeEffect, id)
			rep.expect(invEffectBound, byID[eid] >= 1 && byID[eid] <= 2, "message %s (charge %s) applied with %d effects and tombstones",
				id, r.model.charges[id], byID[eid])
		}
	}
}

// checkPartitions: each key of the partitioned queue applied once each,
// in publish order, whoever held its partition.
func (r *runner) checkPartitions(s *state, rep *report) {
	for _, key := range sortedKeys(r.model.partSeqs) {
		got := s.part[key]
		rep.expect(invPartOrder, slices.IsSorted(got) && len(slices.Compact(slices.Clone(got))) == len(got),
			"partitioned key %s applied out of order or twice: %v", key, got)
		rep.expect(invNothingLost, len(got) == len(r.model.partSeqs[key]) || s.dead[partConsumer][deadletters.ReasonMaxAttempts] > 0,
			"partitioned key %s: published %v, applied %v", key, r.model.partSeqs[key], got)
	}
}

func (r *runner) checkKeys(s *state, rep *report) {
	for _, key := range sortedKeys(r.model.keyedSeqs) {
		got := s.ordered[key]
		rep.expect(invKeyOrder, slices.IsSorted(got) && len(slices.Compact(slices.Clone(got))) == len(got),
			"key %s applied out of order or twice: %v", key, got)
		rep.expect(invNothingLost, len(got) == len(r.model.keyedSeqs[key]) || s.dead[orderedConsumer][deadletters.ReasonMaxAttempts] > 0,
			"key %s: published %v, applied %v", key, r.model.keyedSeqs[key], got)
	}
}

func (r *runner) checkDeadLetters(s *state, rep *report) {
	for _, consumer := range sortedKeys(s.dead) {
		for reason, n := range s.dead[consumer] {
			rep.expect(invDeadLetters, reason != "" && slices.Contains(expectedReasons, reason),
				"%d dead letters of %s with reason %q", n, consumer, reason)
		}
	}
	// Every copy in a dead-letter queue has its row. A row may outnumber
	// the copies: a bad message whose worker died after the commit that
	// wrote its row, before its copy was confirmed, is delivered again and
	// dead-lettered again.
	rep.expect(invDeadLetters, s.waiting["dlq:"+r.queue] <= s.waiting[mainConsumer],
		"dead-letter queue of %s holds %d messages, %d rows wait for an operator", r.queue, s.waiting["dlq:"+r.queue], s.waiting[mainConsumer])
	rep.expect(invDeadLetters, s.waiting["dlq:"+r.ordered] <= s.waiting[orderedConsumer],
		"dead-letter queue of %s holds %d messages, %d rows wait for an operator", r.ordered, s.waiting["dlq:"+r.ordered], s.waiting[orderedConsumer])
}
