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
	var ch *amqp.Channel
	connect := func() error {
		if ch != nil {
			_ = ch.Close()
		}
		var err error
		ch, err = confirmChannel(ctx, o.amqpURLs)
		return err
	}
	if err := connect(); err != nil {
		return res, err
	}
	defer func() { _ = ch.Close() }()
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
			return waitConfirms(ctx, &pending, connect, publishOne)
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
	if err := waitConfirms(ctx, &pending, connect, publishOne); err != nil {
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

// maxRepublish bounds how often one deposit is sent again after a nack:
// with pauses growing from 200 ms to 2 s, about 25 s, longer than a quorum
// queue's leader election.
const maxRepublish = 15

// waitConfirms waits for every pending confirm. A nack means the broker
// did not take the message (a quorum queue refuses publishes while it
// elects a new leader), so the deposit is published again, as a producer
// does: through a new connection (RabbitMQ 3.10 may go on nacking every
// publish of a connection that saw the election, where a new one is not),
// up to maxRepublish times with a pause growing to 2 s. A second copy that
// did arrive is what the worker's inbox is for.
func waitConfirms(ctx context.Context, pending *[]sent, reconnect func() error, publish func(sent) (sent, error)) error {
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
		case <-time.After(min(200*time.Millisecond<<attempt, 2*time.Second)):
		}
		if err := reconnect(); err != nil {
			return err
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

// confirmChannel connects to one of urls, tried in a shuffled order, and
// opens a channel in confirm mode; closing the channel closes its
// connection.
func confirmChannel(ctx context.Context, urls []string) (*amqp.Channel, error) {
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open a confirm channel: %w", err)
	}
	go func() {
		<-ch.NotifyClose(make(chan *amqp.Error, 1))
		_ = conn.Close()
	}()
	return ch, nil
}
