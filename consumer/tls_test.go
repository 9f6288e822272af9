package consumer

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// Over amqps the consumer does the TLS handshake below the screen, which
// reads frames, not ciphertext: a message the client cannot decode is
// dead-lettered alone as over TCP, and the connection stays up.
func TestUndecodableHeaderOverTLSIsDeadLetteredAloneAndTheConnectionStays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testbroker.NewTLSProxy(t)
	overTLS := func(cfg *Config) {
		cfg.AMQPURL = proxy.URL()
		cfg.TLSConfig = proxy.ClientConfig()
	}
	e.declare(overTLS)
	p := poison{id: "nested-40", body: `{"poison":true}`, headers: amqp.Table{"deep": nestedTable(40)}}
	good := e.publishAmong(p)
	c := e.newConsumer(e.effectHandler(), overTLS)
	start(t, c)
	waitFor(t, 30*time.Second, "the good messages applied and the poison dead-lettered", func() bool {
		s := c.Stats()
		return s.Processed == int64(len(good)) && s.DeadLettered == 1
	})
	requireUndecodableAlone(t, e, c, good, []poison{p}, []string{"nested-40"})
	require.GreaterOrEqual(t, proxy.Accepted(), 3, "declare, consume and publish connections went through TLS")
}
