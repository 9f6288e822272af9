//go:build cluster

package stream_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/stream"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testcluster"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testrun"
	"github.com/idemkit/idem/migrate"
)

// publishWithin bounds the publishing of one batch of the stream test,
// through the stream's leader election after a kill.
const publishWithin = 3 * time.Minute

// stallAfter is how long the stream test lets a killed node stay down while
// the stream takes no writes.
const stallAfter = 30 * time.Second

// A stream consumer given every node of a cluster reads on while each node
// in turn, whichever it reads from and the stream's leader among them, is
// killed with kill -9, and applies every message of the stream exactly
// once.
func TestAStreamConsumerReadsOnWhileEachNodeInTurnIsKilled(t *testing.T) {
	c := testcluster.Require(t)
	pool, err := pgxpool.New(context.Background(), c.PGURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	tables := idem.Tables{Schema: testdb.Name(t, "t")}
	_, err = migrate.Up(context.Background(), pool, tables)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	e := &env{t: t, pool: pool, tables: tables, eff: testrun.NewEffects(t, pool, tables)}

	name := testdb.Name(t, "s")
	t.Cleanup(func() { c.DeleteQueues(t, name) })
	// publish appends messages from … to-1; when it has been refused for
	// stallAfter, it calls stalled once.
	publish := func(urls []string, from, to int, stalled func()) {
		t.Helper()
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), publishWithin)
		defer cancel()
		env, err := streamio.Open(ctx, streamio.Config{URI: strings.Join(urls, ",")})
		require.NoError(t, err)
		defer env.Close()
		if from == 0 {
			require.NoError(t, env.DeclareStream(ctx, name, streamio.StreamOptions{}))
		}
		var out []streamio.Outgoing
		for i := from; i < to; i++ {
			out = append(out, streamio.Outgoing{MessageID: fmt.Sprintf("m-%d", i), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		}
		// While the stream elects a leader after a kill, its producers are
		// refused (stream not available): publish again, as a producer
		// would; copies are the consumer's to skip.
		for {
			err := env.Publish(ctx, name, out)
			if err == nil {
				return
			}
			require.NoError(t, ctx.Err(), "publishing within %s: %v", publishWithin, err)
			t.Logf("%s publish again: %v", time.Now().Format("15:04:05.000"), err)
			if stalled != nil && time.Since(began) > stallAfter {
				stalled()
				stalled = nil
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	publish(c.StreamURLs, 0, 500, nil)

	cfg := consumer.Config{Name: "test", Pool: pool, Tables: tables, Logger: testrun.Logger(),
		AMQPURLs: c.AMQPURLs, ShutdownTimeout: 10 * time.Second}
	cons, err := consumer.New(cfg)
	require.NoError(t, err)
	cons.Handle(e.effectHandler())
	// The cluster's stream ports are not the default one that a URL derived
	// from AMQPURLs would name.
	s, err := stream.New(cons, stream.Config{Stream: name, URL: strings.Join(c.StreamURLs, ",")})
	require.NoError(t, err)
	start(t, s)
	waitFor(t, time.Minute, "the first 500 messages applied", func() bool { return len(e.effects()) == 500 })

	// A stream elects a leader among the members that run: before a kill,
	// every member is back, so that two of three remain.
	allOnline := func() bool {
		q := c.QuorumQueue(t, name)
		return q.Leader != "" && len(q.Online) == len(c.Nodes)
	}
	published := 500
	for i, node := range c.Nodes {
		waitFor(t, time.Minute, "every member of the stream online, a leader elected", allOnline)
		c.Kill(t, node)
		t.Logf("%s killed %s", time.Now().Format("15:04:05.000"), node)
		others := slices.Delete(slices.Clone(c.StreamURLs), i, i+1)
		down := true
		publish(others, published, published+300, func() {
			// RabbitMQ 3.10 now and then leaves a stream without a leader
			// until the killed member returns: what idem must survive then
			// is the wait, not the node's absence.
			t.Logf("the stream took no writes for %s with %s down: starting it again", stallAfter, node)
			c.Start(t, node)
			down = false
		})
		published += 300
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d messages applied", published),
			func() bool { return len(e.effects()) == published })
		if down {
			c.Start(t, node)
		}
	}
	counts := e.effects()
	require.Len(t, counts, published)
	for id, n := range counts {
		require.Equal(t, 1, n, "%s applied once", id)
	}
}
