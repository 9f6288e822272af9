package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/partitions"
)

// published is what a publish run sent: the deposits it expects applied.
type published struct {
	messages int              // everything sent, copies included
	expected map[string]int64 // account → sum of distinct deposits
}

// publish sends o.n deposits with unique ids, about o.dup of them a second
// time with the same id and body, and waits until the broker stored them
// all (amqpnodes.Publisher: publisher confirms; a deposit not confirmed,
// nacked or on a node that died, is published again through another node,
// under the same id). The ids and amounts derive from the run's name
// (o.run, random when empty): publishing again under the same name sends
// the same deposits, which the worker applies once.
func publish(ctx context.Context, o options, logger *slog.Logger) (published, error) {
	res := published{expected: map[string]int64{}}
	pub, err := amqpnodes.NewPublisher(ctx, o.amqpURLs)
	if err != nil {
		return res, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	defer pub.Close()
	run := o.run
	if run == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		run = hex.EncodeToString(b[:])
	}
	seed := fnv.New64a()
	_, _ = seed.Write([]byte(run))
	rng := mrand.New(mrand.NewPCG(seed.Sum64(), 0))
	prefix := "dep-" + run
	logger.Info("publishing", "deposits", o.n, "run", run, "id_prefix", prefix)
	start := time.Now()
	send := func(id, account string, body []byte) error {
		// To the queue, or with -partitions to its exchange with the
		// account as routing key: one account's deposits, one partition.
		exchange, key := partitions.Route(o.queue, o.partitions, account)
		res.messages++
		return pub.Publish(ctx, exchange, key, amqp.Publishing{MessageId: id, ContentType: "application/json", Body: body})
	}
	for i := 0; i < o.n; i++ {
		account := fmt.Sprintf("A%d", i%o.accounts+1)
		amount := int64(rng.IntN(100) + 1)
		body, _ := json.Marshal(map[string]any{"account": account, "amount": amount})
		// Time-ordered (a UUIDv7 after the run's prefix): each claim
		// inserts at the right edge of the run's range of the inbox index.
		id := prefix + "-" + idem.NewMessageID()
		res.expected[account] += amount
		if err := send(id, account, body); err != nil {
			return res, err
		}
		if rng.Float64() < o.dup {
			if err := send(id, account, body); err != nil { // the producer retried
				return res, err
			}
		}
	}
	if err := pub.Flush(ctx); err != nil {
		return res, err
	}
	logger.Info("published", "deposits", o.n, "messages", res.messages, "duplicates", res.messages-o.n,
		"queue", o.queue, "run", run, "id_prefix", prefix, "took", time.Since(start).Round(time.Millisecond))
	return res, nil
}
