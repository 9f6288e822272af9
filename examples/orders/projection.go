package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/pgnodes"
	"github.com/idemkit/idem/projection"
)

// event is an order event as published on the stream.
type event struct {
	OrderID string `json:"orderId"`
	Version int    `json:"version"`
	Type    string `json:"type"`
	// At is when the event was created (the message's timestamp), not part
	// of the body: the guard keeps it with a parked event.
	At time.Time `json:"at,omitzero"`
}

// statuses maps event types to the status they give an order.
var statuses = map[string]string{"OrderPlaced": "placed", "OrderPaid": "paid", "OrderShipped": "shipped"}

// consumerName scopes the inbox and the checkpoint of the projection.
const consumerName = "orders-overview"

// notifyShipped is the effect type of the "your order has shipped" e-mail.
const notifyShipped = "notify_shipped"

// overviewTable is the projection's table, in the schema of o.
func overviewTable(o options) string {
	return pgx.Identifier{o.schema, "order_overview"}.Sanitize()
}

// setup connects, migrates idem's tables into the schema and creates the
// projection.
func setup(ctx context.Context, o options) (*pgxpool.Pool, error) {
	// pgnodes: a host that stops answering costs seconds (a connect
	// timeout per host of a multi-host URL, TCP keepalives).
	pool, err := pgnodes.New(ctx, o.pgURL)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if _, err := migrate.Up(ctx, pool, idem.Tables{Schema: o.schema}); err != nil {
		pool.Close()
		return nil, err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+overviewTable(o)+` (
		order_id   text        PRIMARY KEY,
		status     text        NOT NULL,
		version    integer     NOT NULL,
		updated_at timestamptz NOT NULL)`)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("create order_overview: %w", err)
	}
	return pool, nil
}

// newOverview declares the projection: its one table, which a rebuild
// builds again beside the live one and swaps in.
func newOverview(o options) (*projection.Projection, error) {
	return projection.New(projection.Config{Name: "order_overview", Schema: o.schema, Tables: []string{"order_overview"}})
}

// newConsumer builds the projection's stream consumer.
func newConsumer(o options, pool *pgxpool.Pool, overview *projection.Projection) (*consumer.Consumer, error) {
	tables := idem.Tables{Schema: o.schema}
	nodes, err := amqpnodes.Split(o.amqpURL)
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(consumer.Config{
		Name:        consumerName,
		Stream:      o.stream,
		StreamURL:   o.streamURL,
		Pool:        pool,
		AMQPURLs:    nodes,
		Tables:      tables,
		Logger:      o.logger,
		BusinessKey: orderKey,
	})
	if err != nil {
		return nil, err
	}
	l, err := ledger.New(ledger.Config{Tables: tables})
	if err != nil {
		return nil, err
	}
	p := &orders{overview: overview, ledger: l, mailURL: o.mailURL}
	p.guard, err = projection.NewGuard(projection.GuardConfig[event]{
		Projection: overview, Table: "order_overview", KeyColumn: "order_id", VersionColumn: "version",
		Gaps: projection.GapApply, Tables: tables,
		Key:     func(ev event) string { return ev.OrderID },
		Version: func(ev event) int64 { return int64(ev.Version) },
		Apply:   p.apply,
	})
	if err != nil {
		return nil, err
	}
	c.Handle(consumer.JSON(p.handle))
	return c, nil
}

// orderKey is the business key: the order id. Repairs select by it.
func orderKey(m *consumer.Message) (string, error) {
	var ev event
	if err := json.Unmarshal(m.Body, &ev); err != nil {
		return "", nil // the handler dead-letters it as decode_error
	}
	return ev.OrderID, nil
}

// orders keeps order_overview: one row per order, its newest status.
//
// The version guard applies an event only when its version is newer than
// the row's: a stale event (a late duplicate, an event that arrives after a
// newer one) is a no-op, counted in idem.projection.events. A gap (version
// 3 while the row is at 1) is applied (projection.GapApply): the overview
// shows the newest state known, and the missing event, when it arrives, is
// stale. Newest-wins makes the final row the same whatever the order of
// arrival, so a rebuild reproduces what the live worker built; updated_at
// is the event's creation time, not now(), for the same reason.
type orders struct {
	overview *projection.Projection
	guard    *projection.Guard[event]
	ledger   *ledger.Ledger
	mailURL  string
}

func (p *orders) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev event) error {
	if _, ok := statuses[ev.Type]; ev.OrderID == "" || ev.Version < 1 || !ok {
		return consumer.DeadLetter("invalid_event", fmt.Errorf("want orderId, version ≥ 1 and a known type, got %+v", ev))
	}
	if ev.At = m.Timestamp; ev.At.IsZero() {
		return consumer.DeadLetter("invalid_event", errors.New("the event has no creation time"))
	}
	// In a forensic replay the guard only says what it would do.
	decision, err := p.guard.Handle(ctx, tx, ev)
	if err != nil || decision != projection.Applied || ev.Type != "OrderShipped" {
		return err
	}
	_, err = p.ledger.Record(ctx, tx, ledger.Effect{
		Type:        notifyShipped,
		BusinessKey: ev.OrderID,
		Target:      p.mailURL,
		Request:     map[string]string{"orderId": ev.OrderID, "template": "order_shipped"},
		Consumer:    consumerName,
		MessageID:   m.ID,
	})
	return err
}

// apply writes an event the guard found newer into the overview: the live
// table, or its shadow during a rebuild.
func (p *orders) apply(ctx context.Context, tx pgx.Tx, ev event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+p.overview.Table(ctx, "order_overview")+` (order_id, status, version, updated_at)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at`,
		ev.OrderID, statuses[ev.Type], ev.Version, ev.At.UTC().Truncate(time.Microsecond))
	return err
}

// resetProjection is the reset hook of a rebuild in place (--in-place):
// empty the overview, in the transaction that registers the rebuild run.
func resetProjection(o options) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE `+overviewTable(o))
		return err
	}
}
