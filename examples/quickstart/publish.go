package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/partitions"
)

// published is what a publish run sent: the deposits it expects applied.
type published struct {
	messages int              // everything sent, copies included
	expected map[string]int64 // account → sum of distinct deposits
}

// publish sends o.n deposits with unique ids, about o.dup of them a second
// time with the same id and body, using publisher confirms.
func publish(ctx context.Context, o options, logger *slog.Logger) (published, error) {
	res := published{expected: map[string]int64{}}
	conn, _, err := amqpnodes.Dial(ctx, o.amqpURLs, amqp.Config{})
	if err != nil {
		return res, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return res, err
	}
	if err := ch.Confirm(false); err != nil {
		return res, err
	}
	var run [4]byte
	_, _ = rand.Read(run[:])
	prefix := "dep-" + hex.EncodeToString(run[:])
	start := time.Now()
	var pending []sent
	publishOne := func(m sent) (sent, error) {
		// To the queue, or with -partitions to its exchange with the
		// account as routing key: one account's deposits, one partition.
		dc, err := partitions.Publish(ctx, ch, o.queue, o.partitions, m.account, amqp.Publishing{
			MessageId: m.id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: m.body})
		if err != nil {
			return m, fmt.Errorf("publish %s: %w", m.id, err)
		}
		m.confirm = dc
		return m, nil
	}
	send := func(id, account string, body []byte) error {
		m, err := publishOne(sent{id: id, account: account, body: body})
		if err != nil {
			return err
		}
		res.messages++
		pending = append(pending, m)
		if len(pending) >= 500 {
			return waitConfirms(ctx, &pending, publishOne)
		}
		return nil
	}
	for i := 0; i < o.n; i++ {
		account := fmt.Sprintf("A%d", i%o.accounts+1)
		amount := int64(mrand.IntN(100) + 1)
		body, _ := json.Marshal(map[string]any{"account": account, "amount": amount})
		id := fmt.Sprintf("%s-%d", prefix, i)
		res.expected[account] += amount
		if err := send(id, account, body); err != nil {
			return res, err
		}
		if mrand.Float64() < o.dup {
			if err := send(id, account, body); err != nil { // the producer retried
				return res, err
			}
		}
	}
	if err := waitConfirms(ctx, &pending, publishOne); err != nil {
		return res, err
	}
	logger.Info("published", "deposits", o.n, "messages", res.messages, "duplicates", res.messages-o.n,
		"queue", o.queue, "id_prefix", prefix, "took", time.Since(start).Round(time.Millisecond))
	return res, nil
}

// sent is one published deposit awaiting its confirm.
type sent struct {
	id, account string
	body        []byte
	confirm     *amqp.DeferredConfirmation
}

// maxRepublish bounds how often one deposit is sent again after a nack.
const maxRepublish = 5

// waitConfirms waits for every pending confirm. A nack means the broker
// did not take the message (a quorum queue refuses publishes while it
// elects a new leader), so the deposit is published again, as a producer
// does: up to maxRepublish times with a growing pause. A second copy that
// did arrive is what the worker's inbox is for.
func waitConfirms(ctx context.Context, pending *[]sent, publish func(sent) (sent, error)) error {
	for attempt := 0; len(*pending) > 0; attempt++ {
		var nacked []sent
		for _, m := range *pending {
			ok, err := m.confirm.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				nacked = append(nacked, m)
			}
		}
		*pending = (*pending)[:0]
		if len(nacked) == 0 {
			return nil
		}
		if attempt == maxRepublish {
			return fmt.Errorf("broker nacked deposit %s %d times", nacked[0].id, attempt+1)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
		for _, m := range nacked {
			m, err := publish(m)
			if err != nil {
				return err
			}
			*pending = append(*pending, m)
		}
	}
	return nil
}
