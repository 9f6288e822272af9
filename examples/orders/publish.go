package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
)

// publishConfig says what publish sends.
type publishConfig struct {
	n     int     // events, duplicates excluded
	dup   float64 // share of events published a second time, a little later
	swap  float64 // share of orders whose Paid and Shipped events are swapped
	seed  uint64  // the same seed publishes the same events
	first int     // the first order's number: o-<first>, o-<first+1> …
}

func publishCommand(ctx context.Context, o options, args []string) error {
	fs := flag.NewFlagSet("orders publish", flag.ContinueOnError)
	cfg := publishConfig{first: 1}
	fs.IntVar(&cfg.n, "n", 20000, "events to publish (3 per order), duplicates not counted")
	fs.Float64Var(&cfg.dup, "dup", 0.03, "share of events published twice (same id, same body)")
	fs.Float64Var(&cfg.swap, "swap", 0.01, "share of orders whose OrderShipped comes before OrderPaid")
	fs.Uint64Var(&cfg.seed, "seed", 1, "random seed: the same seed publishes the same events")
	fs.IntVar(&cfg.first, "first-order", 1, "number of the first order (publish more orders later with a higher one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	sent, err := publish(ctx, o, events(cfg))
	o.logger.Info("published", "stream", o.stream, "events", cfg.n, "messages", sent,
		"took", time.Since(start).Round(time.Millisecond))
	return err
}

// message is an event to publish: its message id and JSON body.
type message struct {
	id   string
	body []byte
}

// events returns the stream cfg describes: orders o-<first>, … each placed,
// paid and shipped, interleaved over 64 orders in progress; in some orders
// shipped comes before paid (a gap, then a stale event); some events come
// again up to 50 positions later, as when a producer retries.
func events(cfg publishConfig) []message {
	r := rand.New(rand.NewPCG(cfg.seed, 0x6f72646572))
	const window = 64
	var active [][]event
	var base []event
	for order := max(cfg.first, 1); len(base) < cfg.n; {
		for len(active) < window {
			id := fmt.Sprintf("o-%d", order)
			order++
			evs := []event{{OrderID: id, Version: 1, Type: "OrderPlaced"}, {OrderID: id, Version: 2, Type: "OrderPaid"},
				{OrderID: id, Version: 3, Type: "OrderShipped"}}
			if r.Float64() < cfg.swap {
				evs[1], evs[2] = evs[2], evs[1]
			}
			active = append(active, evs)
		}
		i := r.IntN(len(active))
		base = append(base, active[i][0])
		if active[i] = active[i][1:]; len(active[i]) == 0 {
			active = append(active[:i], active[i+1:]...)
		}
	}
	type delayed struct {
		at int
		m  message
	}
	var later []delayed
	out := make([]message, 0, cfg.n+int(float64(cfg.n)*cfg.dup)+8)
	for i, ev := range base {
		body, _ := json.Marshal(ev)
		m := message{id: fmt.Sprintf("evt-%s-%d", ev.OrderID, ev.Version), body: body}
		out = append(out, m)
		if r.Float64() < cfg.dup {
			later = append(later, delayed{at: i + 1 + r.IntN(50), m: m})
		}
		keep := later[:0]
		for _, d := range later {
			if d.at <= i {
				out = append(out, d.m)
			} else {
				keep = append(keep, d)
			}
		}
		later = keep
	}
	for _, d := range later {
		out = append(out, d.m)
	}
	return out
}

// confirmWindow is how many messages publish sends before it waits for
// their confirms.
const confirmWindow = 1000

// publish appends msgs to the stream over AMQP 0-9-1, declaring the stream
// first, and returns how many the broker confirmed. The message-id and
// timestamp properties become the stream records' message-id and
// creation-time.
func publish(ctx context.Context, o options, msgs []message) (int, error) {
	nodes, err := amqpnodes.Split(o.amqpURL)
	if err != nil {
		return 0, err
	}
	conn, _, err := amqpnodes.Dial(ctx, nodes, amqp.Config{Properties: amqp.Table{"connection_name": "orders-publish"}})
	if err != nil {
		return 0, fmt.Errorf("publish: connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("publish: channel: %w", err)
	}
	if _, err := ch.QueueDeclare(o.stream, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		return 0, fmt.Errorf("publish: declare the stream %s: %w", o.stream, err)
	}
	if err := ch.Confirm(false); err != nil {
		return 0, fmt.Errorf("publish: confirm mode: %w", err)
	}
	sent := 0
	for sent < len(msgs) {
		window := msgs[sent:min(sent+confirmWindow, len(msgs))]
		if err := publishWindow(ctx, ch, o.stream, window); err != nil {
			return sent, err
		}
		sent += len(window)
	}
	return sent, nil
}

// publishWindow publishes msgs and waits until the broker confirmed them.
func publishWindow(ctx context.Context, ch *amqp.Channel, stream string, msgs []message) error {
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", stream, true, false, amqp.Publishing{
			MessageId: m.id, ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Timestamp: time.Now(), Body: m.body})
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.id, err)
		}
		confirms = append(confirms, dc)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i, dc := range confirms {
		ok, err := dc.WaitContext(wctx)
		if err != nil {
			return fmt.Errorf("publish %s: waiting for the confirm: %w", msgs[i].id, err)
		}
		if !ok {
			return errors.New("publish " + msgs[i].id + ": the broker refused it")
		}
	}
	return nil
}
