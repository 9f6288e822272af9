package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/partitions"
)

// publishConfig says what a publish run sends.
type publishConfig struct {
	amqpURL, queue string
	// partitions are the worker's (consumer.Config.Partitions): with them,
	// each message goes to the queue's exchange with its correlation id
	// (the capture request) as routing key.
	partitions int
	// n is the number of distinct capture requests.
	n int
	// dup is the fraction of messages published a second time with the same
	// message id and body (a broker-level duplicate).
	dup float64
	// retry is the fraction of capture requests sent again under a new
	// message id (a producer that retried: a business duplicate).
	retry float64
	// bad adds invalid envelopes and a message id reused with another payload.
	bad bool
}

// published is what a publish run sent.
type published struct {
	// prefix starts every message id and captureRequestId of the run.
	prefix string
	// messages counts everything sent, copies included.
	messages int
	// captures counts the distinct valid captureRequestIds: each must be
	// charged exactly once.
	captures int
	// dups and retries count the copies sent.
	dups, retries int
	// bad counts the bad messages sent.
	bad int
	// deadLetters counts the messages that must end in the dead-letter
	// queue, by reason.
	deadLetters map[string]int
}

// badMessages are the messages publish -bad sends, for run prefix p: four
// invalid envelopes and a message id used for two different payloads (one
// copy is processed, whichever the inbox claims first; the other is the
// payload conflict).
func badMessages(p string) []amqp.Publishing {
	valid := func(cr string, amount int) []byte {
		return fmt.Appendf(nil, `{"schemaVersion":1,"captureRequestId":%q,"orderId":"o-bad","amount":%d,"currency":"EUR"}`, p+"-"+cr, amount)
	}
	return []amqp.Publishing{
		{MessageId: p + "-bad-no-correlation-id", Body: valid("cr-no-correlation-id", 100)},
		{MessageId: p + "-bad-schema-version", CorrelationId: p + "-corr-bad",
			Body: fmt.Appendf(nil, `{"schemaVersion":2,"captureRequestId":%q,"orderId":"o-bad","amount":100,"currency":"EUR"}`, p+"-cr-schema-version")},
		{MessageId: p + "-bad-no-capture-request-id", CorrelationId: p + "-corr-bad",
			Body: []byte(`{"schemaVersion":1,"orderId":"o-bad","amount":100,"currency":"EUR"}`)},
		{MessageId: p + "-bad-malformed", CorrelationId: p + "-corr-bad", Body: []byte(`{"schemaVersion":1,"captureRequestId":`)},
		{MessageId: p + "-bad-conflict", CorrelationId: p + "-corr-bad", Body: valid("cr-conflict", 100)},
		{MessageId: p + "-bad-conflict", CorrelationId: p + "-corr-bad", Body: valid("cr-conflict", 200)},
	}
}

// publish sends cfg.n capture requests with publisher confirms, plus the
// duplicates, producer retries and bad messages cfg asks for.
func publish(ctx context.Context, cfg publishConfig) (published, error) {
	var run [4]byte
	_, _ = rand.Read(run[:])
	res := published{prefix: "pay-" + hex.EncodeToString(run[:]), deadLetters: map[string]int{}}
	urls, err := amqpnodes.Split(cfg.amqpURL)
	if err != nil {
		return res, err
	}
	pub, err := amqpnodes.NewPublisher(ctx, urls)
	if err != nil {
		return res, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	defer pub.Close()
	send := func(m amqp.Publishing) error {
		m.ContentType, m.Timestamp = "application/json", time.Now()
		key := m.CorrelationId
		if key == "" {
			key = m.MessageId
		}
		exchange, routingKey := partitions.Route(cfg.queue, cfg.partitions, key)
		res.messages++
		return pub.Publish(ctx, exchange, routingKey, m)
	}
	currencies := []string{"EUR", "USD", "GBP"}
	for i := range cfg.n {
		body, _ := json.Marshal(captureRequested{
			SchemaVersion:    ptr(schemaVersion),
			CaptureRequestID: fmt.Sprintf("%s-cr-%d", res.prefix, i),
			OrderID:          fmt.Sprintf("o-%d", i),
			Amount:           ptr(int64(mrand.IntN(100000) + 100)),
			Currency:         currencies[i%len(currencies)],
		})
		// A time-ordered message id (a UUIDv7 after the run's prefix):
		// each claim inserts at the right edge of the run's range of the
		// inbox index.
		m := amqp.Publishing{MessageId: res.prefix + "-m-" + idem.NewMessageID(), CorrelationId: fmt.Sprintf("%s-corr-%d", res.prefix, i), Body: body}
		if err := send(m); err != nil {
			return res, err
		}
		res.captures++
		if mrand.Float64() < cfg.dup {
			res.dups++
			if err := send(m); err != nil {
				return res, err
			}
		}
		if mrand.Float64() < cfg.retry {
			res.retries++
			m.MessageId += "-retry"
			if err := send(m); err != nil {
				return res, err
			}
		}
	}
	if cfg.bad {
		for _, m := range badMessages(res.prefix) {
			res.bad++
			if err := send(m); err != nil {
				return res, err
			}
		}
		res.captures++ // the conflict's processed copy
		res.deadLetters[reasonInvalidEnvelope] += 4
		res.deadLetters["payload_conflict"]++
	}
	if err := pub.Flush(ctx); err != nil {
		if errors.Is(err, amqpnodes.ErrNotStored) {
			return res, fmt.Errorf("%w: is queue %s declared? start the worker first", err, cfg.queue)
		}
		return res, err
	}
	return res, nil
}

func ptr[T any](v T) *T { return &v }

// runPublish is the publish subcommand.
func runPublish(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments publish", flag.ContinueOnError)
	cfg := publishFlags(fs)
	fs.BoolVar(&cfg.bad, "bad", false, "also send invalid envelopes and a message id reused with another payload")
	amqpURLFlag(fs, &cfg.amqpURL)
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	res, err := publish(ctx, *cfg)
	if err != nil {
		return err
	}
	newLogger(slog.LevelInfo).Info("published", "queue", cfg.queue, "prefix", res.prefix, "messages", res.messages,
		"captures", res.captures, "duplicates", res.dups, "producer_retries", res.retries,
		"bad", res.bad, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// publishFlags registers the publishing flags on fs.
func publishFlags(fs *flag.FlagSet) *publishConfig {
	cfg := &publishConfig{}
	fs.StringVar(&cfg.queue, "queue", defaultQueue, "queue to publish to")
	fs.IntVar(&cfg.partitions, "partitions", 0, "the worker's -partitions: publish to the queue's exchange, keyed by capture request")
	fs.IntVar(&cfg.n, "n", 1000, "capture requests to publish")
	fs.Float64Var(&cfg.dup, "dup", 0.2, "fraction re-published with the same message id and body")
	fs.Float64Var(&cfg.retry, "retry", 0.1, "fraction re-sent under a new message id (a producer retry: business duplicate)")
	return cfg
}
