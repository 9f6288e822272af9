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
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
)

// event is an order event as published on the stream.
type event struct {
	OrderID string `json:"orderId"`
	Version int    `json:"version"`
	Type    string `json:"type"`
}

// statuses maps event types to the status they give an order.
var statuses = map[string]string{"OrderPlaced": "placed", "OrderPaid": "paid", "OrderShipped": "shipped"}

// consumerName scopes the inbox and the checkpoint of the projection.
const consumerName = "orders-overview"

// notifyShipped is the effect type of the "your order has shipped" e-mail.
const notifyShipped = "notify_shipped"

func streamURL() string { return streamio.URLFromEnv() }

func overviewTable(o options) string {
	return pgx.Identifier{o.schema, "order_overview"}.Sanitize()
}

// setup connects, migrates idem's tables into the schema and creates the
// projection.
func setup(ctx context.Context, o options) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, o.pgURL)
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

// newConsumer builds the projection's stream consumer.
func newConsumer(o options, pool *pgxpool.Pool) (*consumer.Consumer, error) {
	tables := idem.Tables{Schema: o.schema}
	c, err := consumer.New(consumer.Config{
		Name:        consumerName,
		Pool:        pool,
		Stream:      o.stream,
		StreamURL:   o.streamURL,
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
	p := &projection{table: overviewTable(o), ledger: l, mailURL: o.mailURL}
	p.upsert = `INSERT INTO ` + p.table + ` AS o (order_id, status, version, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
		WHERE o.version < EXCLUDED.version
		RETURNING true`
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

// projection keeps order_overview: one row per order, its newest status.
//
// Version guard: an event applies only when its version is newer than the
// row's. A stale event (an older or equal version: a late duplicate, an
// event that arrives after a newer one) is a no-op. A gap (version 3 while
// the row is at 1) is applied: the overview shows the newest state known,
// and the missing event, when it arrives, is stale. Applying newest-wins
// makes the final row the same whatever the order of arrival, so a rebuild
// reproduces what the live worker built.
type projection struct {
	table   string
	upsert  string
	ledger  *ledger.Ledger
	mailURL string
}

func (p *projection) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev event) error {
	status, ok := statuses[ev.Type]
	if ev.OrderID == "" || ev.Version < 1 || !ok {
		return consumer.DeadLetter("invalid_event", fmt.Errorf("want orderId, version ≥ 1 and a known type, got %+v", ev))
	}
	at := m.Timestamp
	if at.IsZero() {
		return consumer.DeadLetter("invalid_event", errors.New("the event has no creation time"))
	}
	var applied bool
	if idem.ModeFrom(ctx) == idem.Forensic {
		// Read only: say what would happen.
		var current int
		err := tx.QueryRow(ctx, `SELECT version FROM `+p.table+` WHERE order_id = $1`, ev.OrderID).Scan(&current)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			applied = true
		case err != nil:
			return err
		default:
			applied = ev.Version > current
		}
	} else {
		err := tx.QueryRow(ctx, p.upsert, ev.OrderID, status, ev.Version, at.UTC().Truncate(time.Microsecond)).Scan(&applied)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	if !applied || ev.Type != "OrderShipped" {
		return nil
	}
	_, err := p.ledger.Record(ctx, tx, ledger.Effect{
		Type:        notifyShipped,
		BusinessKey: ev.OrderID,
		Target:      p.mailURL,
		Request:     map[string]string{"orderId": ev.OrderID, "template": "order_shipped"},
		Consumer:    consumerName,
		MessageID:   m.ID,
	})
	return err
}

// resetProjection is the rebuild's reset hook: empty the overview, in the
// transaction that registers the rebuild run.
func resetProjection(o options) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE `+overviewTable(o))
		return err
	}
}
