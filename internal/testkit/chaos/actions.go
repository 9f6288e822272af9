package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/partitions"
	"github.com/idemkit/idem/retention"
)

// do carries out one action.
func (r *runner) do(ctx context.Context, a Action) error {
	for _, p := range r.procs {
		if err := p.alive(); err != nil {
			return err
		}
	}
	switch a.Kind {
	case KindPublishNew, KindPublishCharge, KindPublishSameBody, KindPublishSameID, KindPublishConflict, KindPublishSpelling:
		return r.publishDeposit(a)
	case KindPublishKeyed:
		body, _ := json.Marshal(keyed{Key: a.Key, Seq: a.Seq, Fail: a.Fail})
		body = []byte(fmt.Sprintf(`{"id":"%s-%d",%s`, a.Key, a.Seq, body[1:]))
		r.model.keyed(a.Key, a.Seq)
		return r.pub.publish(r.ordered, body)
	case KindMalformed:
		r.model.refused(reasonDecode)
		return r.pub.publish(r.queue, []byte(`{"id":"bad`+fmt.Sprint(r.model.next())+`","amount":`))
	case KindNoID:
		r.model.refused(deadletters.ReasonMissingMessageID)
		return r.pub.publish(r.queue, []byte(fmt.Sprintf(`{"amount":%d}`, r.model.next())))
	case KindOversized:
		r.model.refused(deadletters.ReasonTooLarge)
		pad := strings.Repeat("x", maxMessageBytes+1024)
		return r.pub.publish(r.queue, []byte(fmt.Sprintf(`{"id":"big%d","amount":1,"pad":"%s"}`, r.model.next(), pad)))
	case KindHTTPNew, KindHTTPRetry, KindHTTPRace, KindHTTPConflict:
		r.request(a)
		return nil
	case KindKill:
		return r.procs[a.Worker%workers].kill()
	case KindKillDispatcher:
		return r.procs[dispatcherProc].kill()
	case KindPublishStream:
		return r.publishStream(a)
	case KindReplay:
		return r.replay(ctx, a)
	case KindRebuild:
		return r.rebuild(ctx, a)
	case KindUndecodable:
		return r.undecodable(ctx, a)
	case KindHTTPExpired:
		return r.expired(ctx, a)
	case KindKillEdge:
		return r.killEdge(ctx, a)
	case KindPublishPart:
		body, _ := json.Marshal(keyed{Key: a.Key, Seq: a.Seq, Fail: a.Fail})
		body = []byte(fmt.Sprintf(`{"id":"%s-%d",%s`, a.Key, a.Seq, body[1:]))
		r.model.partSeqs[a.Key] = append(r.model.partSeqs[a.Key], a.Seq)
		return r.pub.publishPartitioned(r.partQueue, a.Key, body)
	case KindPartJoin:
		r.door("joiner joined")
		return r.procs[joinerProc].join()
	case KindPartLeave:
		r.door("joiner left: " + a.Fate)
		return r.procs[joinerProc].leave(a.Fate == "kill")
	case KindConnCut:
		r.amqpProxies.Sever()
		return nil
	case KindPGRefuse, KindPGBlackhole:
		return r.outage(ctx, a.Kind)
	case KindPGHeal:
		r.pgProxies.Resume()
		r.pgOut = false
		return nil
	case KindNodeKill, KindNodeStart, KindPGCrash:
		return r.doCluster(ctx, a)
	case KindCleanup:
		return r.cleanup(ctx, a)
	case KindRedrive:
		return r.redrive(ctx, a)
	case KindResolve:
		return r.resolve(ctx)
	case KindWait:
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(a.Millis) * time.Millisecond):
		}
		return nil
	}
	return fmt.Errorf("unknown action kind %q", a.Kind)
}

// publishDeposit publishes a main-queue message: an original, or a copy,
// a conflict or another spelling of an earlier one.
func (r *runner) publishDeposit(a Action) error {
	m := r.model
	var d depositMsg
	switch a.Kind {
	case KindPublishNew, KindPublishCharge:
		d = depositMsg{id: a.ID, spelling: a.Spelling, amount: a.Amount, charge: a.Behave}
	case KindPublishSameBody:
		ref, ok := m.originals[a.Ref]
		if !ok {
			return nil // the original was shrunk away
		}
		d = ref
		d.id, d.spelling = a.ID, a.Spelling
	default:
		ref, ok := m.originals[a.Ref]
		if !ok {
			return nil
		}
		d = ref
		if a.Kind == KindPublishConflict {
			d.amount = a.Amount
		}
		if a.Kind == KindPublishSpelling {
			d.spelling = a.Spelling
		}
	}
	m.deposit(d, a.Kind == KindPublishNew || a.Kind == KindPublishCharge || a.Kind == KindPublishSameBody)
	return r.pub.publish(r.queue, d.body())
}

// request sends an action's requests to the HTTP edge and keeps what
// they got.
func (r *runner) request(a Action) {
	m := r.model
	switch a.Kind {
	case KindHTTPNew:
		m.keyAmount[a.ID] = a.Amount
		m.answers[a.ID] = append(m.answers[a.ID], r.edge.post(a.ID, a.Amount))
		m.lastAt[a.ID] = time.Now()
	case KindHTTPRace:
		m.keyAmount[a.ID] = a.Amount
		both := r.edge.race(a.ID, a.Amount)
		m.answers[a.ID] = append(m.answers[a.ID], both[:]...)
		m.lastAt[a.ID] = time.Now()
	default:
		amount, ok := m.keyAmount[a.Ref]
		if !ok {
			return // the first request was shrunk away
		}
		if a.Kind == KindHTTPConflict {
			amount = a.Amount
		}
		m.answers[a.Ref] = append(m.answers[a.Ref], r.edge.post(a.Ref, amount))
		m.lastAt[a.Ref] = time.Now()
	}
}

// outage opens a PostgreSQL outage and holds it until worker 0's readiness
// reports it (at most 8s): readiness must tell the truth. It stays open
// until pg_heal (or the end of the schedule).
func (r *runner) outage(ctx context.Context, kind Kind) error {
	r.pgOut = true
	if kind == KindPGRefuse {
		r.pgProxies.Refuse()
	} else {
		r.pgProxies.Stall()
	}
	r.obs.note(func(o *observations) { o.outages++ })
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if ready, ok := r.ready(ctx); ok && !ready {
			r.obs.note(func(o *observations) { o.outagesSeen++ })
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// ready asks worker 0's /readyz; ok is false when it did not answer.
func (r *runner) ready(ctx context.Context) (ready, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.healthAddr+"/readyz", nil)
	if err != nil {
		return false, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, true
}

// waitReady waits until worker 0 reports ready.
func (r *runner) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ready, _ := r.ready(ctx); ready {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("chaos: worker0 not ready within 30s (logs in %s)", r.dir)
}

// heal ends every fault still open.
func (r *runner) heal(ctx context.Context) error {
	r.pgProxies.Resume()
	r.pgOut = false
	err := r.healCluster(ctx)
	for _, p := range r.procs {
		_ = p.alive()
	}
	return err
}

// doCluster carries out a fault of the cluster's topology: an error
// without one (a cluster case replayed on a single box).
func (r *runner) doCluster(ctx context.Context, a Action) error {
	if r.cluster == nil {
		return fmt.Errorf("%s needs the topology of scripts/cluster.sh (-cluster)", a.Kind)
	}
	switch a.Kind {
	case KindNodeKill:
		return r.nodeKill(ctx, a)
	case KindNodeStart:
		return r.nodeStart(ctx)
	default:
		return r.pgCrash(ctx, a)
	}
}

// redrive moves dead letters back to the main queue, as an operator would.
func (r *runner) redrive(ctx context.Context, a Action) error {
	opts := deadletters.RedriveOptions{AMQPURL: r.amqpURL, Pool: r.pool, Queue: r.queue, Tables: r.tables,
		Consumer: mainConsumer, Operator: "chaos"}
	if nodes := amqpList(r.amqpURL); len(nodes) > 1 {
		opts.AMQPURL, opts.AMQPURLs = "", nodes
	}
	switch a.By {
	case "id":
		opts.MessageID = a.Arg
	case "reason":
		opts.Reason = a.Arg
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := deadletters.Redrive(ctx, opts)
	if errors.Is(err, inbox.ErrBeyondHorizon) {
		err = nil // what entered the dead-letter queue before a cleanup's horizon stays: the door is right to refuse
	}
	if err != nil {
		return fmt.Errorf("redrive: %w", err)
	}
	r.model.redriven += res.Moved
	for id := range r.model.undecodable {
		// Its dead-letter copy holds its body without the header table:
		// sent back, it is a deposit like any other.
		if a.By == "all" || (a.By == "reason" && a.Arg == deadletters.ReasonUndecodable) || (a.By == "id" && a.Arg == id) {
			r.model.undecodable[id] = true
		}
	}
	return nil
}

// cleanup lets the cutoff's time pass, so that what the schedule did
// before it is older than the cutoff, then runs retention as `idem
// cleanup` would, at that cutoff (at or above the floor), and notes which
// inbox rows it forgot: a copy of such a message published later is new
// to the inbox by design, but its charge must not leave again (the
// ledger's tombstone).
func (r *runner) cleanup(ctx context.Context, a Action) error {
	age := time.Duration(a.Millis) * time.Millisecond
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(age + time.Second): // and the second a charge takes to settle
	}
	if _, err := r.read(ctx); err != nil { // the dead letters it may delete, seen first
		return err
	}
	before, err := r.inboxIDs(ctx)
	if err != nil {
		return err
	}
	_, err = retention.Clean(ctx, retention.Config{Pool: r.pool, Tables: r.tables, Floor: cleanupFloor,
		OlderThan: age, LedgerOlderThan: age, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	after, err := r.inboxIDs(ctx)
	if err != nil {
		return err
	}
	for id := range before {
		if !after[id] {
			r.model.forgotten[id] = true
		}
	}
	return nil
}

// inboxIDs are the main consumer's inbox rows.
func (r *runner) inboxIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := r.pool.Query(ctx, `SELECT message_id FROM `+r.tables.Table("inbox")+` WHERE consumer = $1`, mainConsumer)
	if err != nil {
		return nil, fmt.Errorf("reading the inbox: %w", err)
	}
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids[id] = true
	}
	return ids, rows.Err()
}

// resolve settles the unknown charges as an operator would after asking
// the gateway: charged ones succeeded, the others sent again.
func (r *runner) resolve(ctx context.Context) error {
	led, err := ledger.New(ledger.Config{Pool: r.pool, Tables: r.tables})
	if err != nil {
		return err
	}
	entries, err := led.List(ctx, ledger.Filter{Status: ledger.StatusUnknown})
	if err != nil {
		return fmt.Errorf("listing unknown effects: %w", err)
	}
	charged := r.gw.snapshot()
	for _, e := range entries {
		res := ledger.Resolution{As: ledger.StatusPending, Reason: "the gateway has no charge", Operator: "chaos", From: ledger.StatusUnknown}
		if charged[e.IdempotencyKey] > 0 {
			res.As, res.Reason = ledger.StatusSucceeded, "the gateway charged it"
		}
		if _, err := led.Resolve(ctx, e.ID, res); err == nil {
			r.obs.note(func(o *observations) { o.resolved++ })
		}
	}
	return nil
}

// publisher publishes with confirms, straight to the broker (not through
// the workers' proxy): to one of the nodes, and again through another
// when a node dies with publishes unconfirmed (amqpnodes.Publisher).
type publisher struct {
	p *amqpnodes.Publisher
	n int
}

// publishWithin bounds one publish and its confirm, a node's death and
// the queue leaders' election included.
const publishWithin = 60 * time.Second

func newPublisher(ctx context.Context, urls []string) (*publisher, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, err := amqpnodes.NewPublisher(ctx, urls)
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting the publisher: %w", err)
	}
	return &publisher{p: p}, nil
}

func (p *publisher) publish(queue string, body []byte) error {
	return p.publishHeaders(queue, body, nil)
}

// publishPartitioned publishes body to the partitioned queue's exchange
// with key as its routing key.
func (p *publisher) publishPartitioned(queue, key string, body []byte) error {
	exchange, routingKey := partitions.Route(queue, partitionCount, key)
	if err := p.send(exchange, routingKey, body, nil); err != nil {
		return fmt.Errorf("publishing to the partitions: %w", err)
	}
	return nil
}

// publishHeaders publishes body with the header table headers.
func (p *publisher) publishHeaders(queue string, body []byte, headers amqp.Table) error {
	if err := p.send("", queue, body, headers); err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	return nil
}

// send publishes one message and waits until the broker stored it.
func (p *publisher) send(exchange, key string, body []byte, headers amqp.Table) error {
	p.n++
	ctx, cancel := context.WithTimeout(context.Background(), publishWithin)
	defer cancel()
	err := p.p.Publish(ctx, exchange, key, amqp.Publishing{ContentType: "application/json", Body: body,
		MessageId: fmt.Sprintf("p%d", p.n), Headers: headers})
	if err == nil {
		err = p.p.Flush(ctx)
	}
	return err
}

func (p *publisher) close() { _ = p.p.Close() }

// freeAddr is a loopback address nobody listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, nil
}

// undecodableDepth is the nesting of an undecodable message's header
// table: amqp091-go refuses more than 32.
const undecodableDepth = 40

// undecodable publishes a deposit whose header table is nested 40 deep,
// then waits (30s) for its dead letter, unless PostgreSQL is out.
func (r *runner) undecodable(ctx context.Context, a Action) error {
	r.model.refused(deadletters.ReasonUndecodable)
	r.model.undecodable[a.ID] = false
	t := amqp.Table{"leaf": "x"}
	for range undecodableDepth - 1 {
		t = amqp.Table{"n": t}
	}
	body := fmt.Sprintf(`{"id":%q,"amount":1}`, a.ID)
	if err := r.pub.publishHeaders(r.queue, []byte(body), amqp.Table{"deep": t}); err != nil {
		return err
	}
	if r.pgOut {
		return nil
	}
	// Its own row, by its id: a cleanup may have deleted older ones.
	deadline := time.Now().Add(30 * time.Second)
	n := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.tables.Table("dead_letters")+
			` WHERE consumer = $1 AND reason = $2 AND message_id = $3`,
			mainConsumer, deadletters.ReasonUndecodable, a.ID).Scan(&n); err == nil && n > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.door("undecodable published, its dead letter awaited")
	r.obs.note(func(o *observations) {
		o.checks = append(o.checks, check{invUndecodable, n > 0, fmt.Sprintf("%s: no undecodable dead letter within 30s", a.ID)})
	})
	return nil
}
