package consumer

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// deadNode is the URL of a node that refuses connections: nothing listens
// on port 1.
const deadNode = "amqp://guest:guest@127.0.0.1:1/"

// withURL returns the test broker's URL with u changed by edit.
func withURL(t *testing.T, edit func(u *url.URL)) string {
	t.Helper()
	u, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	edit(u)
	return u.String()
}

// A worker given a cluster's nodes consumes through the one that answers,
// whichever order the list is in: a node that is down costs one failed dial
// in a round, not a stall.
func TestAWorkerConsumesThroughWhicheverNodeOfItsListAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	for i, nodes := range [][]string{{deadNode, e.url}, {e.url, deadNode}} {
		c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = ""; cfg.AMQPURLs = nodes })
		stop := start(t, c)
		id := []string{"m-first", "m-second"}[i]
		e.publish(id, `{}`, nil)
		waitFor(t, 20*time.Second, id+" applied", func() bool { return e.effects()[id] == 1 })
		stop()
	}
}

// Configuration errors end Run within the first round of the list, with an
// error naming the cause, instead of being retried as an unavailable
// broker; the other nodes being down changes nothing.
func TestRefusedCredentialsOrAMissingVhostEndRunWithinTheFirstRound(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		edit func(*url.URL)
		want string
	}{
		"missing vhost": {func(u *url.URL) { u.Path = "/no-such-vhost" }, "vhost"},
		"wrong password": {func(u *url.URL) {
			u.User = url.UserPassword(u.User.Username(), "wrong-s3cret")
		}, "username or password not allowed"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			bad := withURL(t, c.edit)
			consumer := e.newConsumer(e.effectHandler(), func(cfg *Config) {
				cfg.AMQPURL = ""
				cfg.AMQPURLs = []string{deadNode, bad, deadNode + "vh"}
				cfg.ReconnectMaxDelay = 30 * time.Second
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			began := time.Now()
			err := consumer.Run(ctx)
			require.Error(t, err, "Run must end with the configuration error")
			require.Less(t, time.Since(began), 15*time.Second, "within the first round, not after backoffs")
			require.Contains(t, err.Error(), c.want)
			require.NotContains(t, err.Error(), "wrong-s3cret")
			require.NotContains(t, err.Error(), "guest:guest@", "every URL is redacted")
		})
	}
}

// New refuses what would otherwise be dialled as one strange node:
// several URLs in AMQPURL, a host list, a malformed URL; both fields at
// once; and a Queue with no broker to consume it from, which Run would
// find only when it starts.
func TestNewRefusesAMalformedBrokerURL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for name, edit := range map[string]func(*Config){
		"two URLs in AMQPURL": func(c *Config) { c.AMQPURL = "amqp://g:secret@127.0.0.1:5681/,amqp://g:secret@127.0.0.1:5682/" },
		"semicolons":          func(c *Config) { c.AMQPURL = "amqp://g:secret@127.0.0.1:5681/;amqp://g:secret@127.0.0.1:5682/" },
		"hosts in authority":  func(c *Config) { c.AMQPURL = "amqp://g:secret@h1:5681,h2:5682/" },
		"bad scheme":          func(c *Config) { c.AMQPURL = "http://g:secret@127.0.0.1/" },
		"bad node in list":    func(c *Config) { c.AMQPURL = ""; c.AMQPURLs = []string{e.url, "amqp://g:secret@h1:port/"} },
		"both fields":         func(c *Config) { c.AMQPURLs = []string{e.url} },
		"a queue, no broker":  func(c *Config) { c.AMQPURL = "" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := e.config()
			edit(&cfg)
			_, err := New(cfg)
			require.ErrorIs(t, err, ErrConfig)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// The retry and dead-letter queues are of the queue's type: quorum by
// default, so that no queue idem declares lives on one node. A quorum
// retry queue dead-letters its expired messages at least once.
func TestRetryAndDeadLetterQueuesFollowTheQueueType(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	ch := testbroker.Channel(t)
	// Declaring with the same arguments is accepted, with others refused
	// (406): the broker checks equivalence.
	_, err := ch.QueueDeclare(e.queue+".retry", true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.queue,
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	})
	require.NoError(t, err, "the retry queue is a quorum queue dead-lettering at least once")
	_, err = ch.QueueDeclare(e.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err, "the dead-letter queue is a quorum queue")
	_, err = ch.QueueDeclare(e.queue+".retry", true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	var ae *amqp.Error
	require.True(t, errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed, "a classic declaration is refused: %v", err)

	// A message that fails once goes through the quorum retry queue and back.
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Attempt == 1 {
			return errors.New("transient")
		}
		return e.eff.Insert(ctx, tx, m.ID)
	}, nil)
	start(t, c)
	e.publish("m-retried", `{}`, nil)
	waitFor(t, 20*time.Second, "m-retried applied after its retry", func() bool { return c.Stats().Processed == 1 })
	require.EqualValues(t, 1, c.Stats().Retried)
	require.Equal(t, 1, e.effects()["m-retried"])
}

// A classic retry queue left by an earlier deployment is replaced by one of
// the queue's type when it is empty, and kept, with its pending retries
// delivered, while it is not.
func TestAClassicRetryQueueIsReplacedOnceItIsEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := testbroker.Channel(t)
	retry := e.queue + ".retry"
	_, err := ch.QueueDeclare(retry, true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.queue,
	})
	require.NoError(t, err)
	// A pending retry, due in a second, keeps the old queue for now.
	require.NoError(t, ch.PublishWithContext(context.Background(), "", retry, false, false, amqp.Publishing{
		MessageId: "m-pending", Body: []byte(`{}`), Expiration: "1000", DeliveryMode: amqp.Persistent,
	}))
	c := e.newConsumer(e.effectHandler(), nil)
	stop := start(t, c)
	waitFor(t, 20*time.Second, "the pending retry applied", func() bool { return e.effects()["m-pending"] == 1 })
	stop()
	isQuorum := func() error {
		ch := testbroker.Channel(t)
		_, err := ch.QueueDeclare(retry, true, false, false, false, e.retryArgs())
		return err
	}
	require.Error(t, isQuorum(), "a retry queue holding retries is kept as it is")

	// The next session finds it empty and replaces it.
	stop = start(t, e.newConsumer(e.effectHandler(), nil))
	waitFor(t, 20*time.Second, "the retry queue replaced", func() bool { return isQuorum() == nil })
	stop()
}

// retryArgs are the arguments of a quorum retry queue of e's queue.
func (e *env) retryArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.queue,
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	}
}

// A field only a queue consumer reads, set on a consumer without a Queue
// (one for a stream, or for Process), is a mistake New refuses, naming it,
// rather than a setting that silently does nothing.
func TestNewRefusesQueueOnlyFieldsWithoutAQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.Queue, cfg.OrderingKey, cfg.Prefetch = "", func(m *Message) string { return m.ID }, 10
	_, err := New(cfg)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "OrderingKey, Prefetch")
}
