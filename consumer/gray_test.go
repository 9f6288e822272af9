package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// Gray failures of a node: it takes TCP connections and never answers (a
// frozen process, a blackholed host). They must cost a worker seconds: the
// heartbeat notices a silent connection within 3 s, a dial gives up on a
// node within amqpconn.DialTimeout, and the node that just failed is
// dialled last.

// blackholedNode returns the URL of a node that accepts TCP connections and
// never answers.
func blackholedNode(t *testing.T) string {
	t.Helper()
	return "amqp://guest:guest@" + testbroker.SilentAddr(t) + "/"
}

// A worker whose list holds a blackholed node starts and consumes through
// the node that answers, whichever it dials first.
func TestAWorkerStartsPastABlackholedNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) {
		cfg.AMQPURL = ""
		cfg.AMQPURLs = []string{blackholedNode(t), e.url}
	})
	start(t, c)
	e.publish("m1", `{}`, nil)
	waitFor(t, 20*time.Second, "m1 applied", func() bool { return e.effects()["m1"] == 1 })
}

// A worker whose node stops answering (its connections open, nothing passes
// either way, new connections taken and never answered) leaves it for
// another node of its list within seconds: the heartbeat notices, and the
// node that failed is dialled last. The connection's default heartbeat
// alone takes 15 s to notice, and a redial of the silent node 10 s more.
func TestAWorkerLeavesANodeThatStopsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	a, b := testbroker.NewProxy(t), testbroker.NewProxy(t)
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) {
		cfg.AMQPURL = ""
		cfg.AMQPURLs = []string{a.URL(), b.URL()}
	})
	start(t, c)
	e.publish("m1", `{}`, nil)
	waitFor(t, 20*time.Second, "m1 applied", func() bool { return e.effects()["m1"] == 1 })
	used, other := a, b
	if a.Accepted() == 0 {
		used, other = b, a
	}
	require.Zero(t, other.Accepted(), "one node serves the session")
	used.Stall()
	e.publish("m2", `{}`, nil)
	waitFor(t, 10*time.Second, "m2 applied through the other node", func() bool { return e.effects()["m2"] == 1 })
	require.Positive(t, other.Accepted())
	require.Equal(t, map[string]int{"m1": 1, "m2": 1}, e.effects())
}
