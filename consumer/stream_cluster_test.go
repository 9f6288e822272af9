//go:build cluster

package consumer

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
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/migrate"
)

// publishWithin bounds the publishing of one batch of the stream test,
// while the broker refuses producers (stream not available, leader not
// ready) after a kill.
const publishWithin = time.Minute

// A stream consumer given every node of a cluster reads on when the node it
// reads from is killed with kill -9, and applies every message of the
// stream exactly once. The node killed is a replica (the client reads from
// replicas while there are any), never the stream's leader: on RabbitMQ
// 3.10 a stream whose leader was killed sometimes takes no writes, and
// cannot even be listed, until the node returns; and one kill per stream,
// as a replica started again may stay unavailable to readers for minutes.
func TestAStreamConsumerReadsOnWhenItsReplicaIsKilled(t *testing.T) {
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
	// publish appends messages from … to-1.
	publish := func(urls []string, from, to int) {
		t.Helper()
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
			time.Sleep(500 * time.Millisecond)
		}
	}
	publish(c.StreamURLs, 0, 500)

	// The cluster's stream ports are not the default one that a URL derived
	// from AMQPURLs would name.
	cfg := Config{Name: "test", Pool: pool, Tables: tables, Logger: testrun.Logger(),
		AMQPURLs: c.AMQPURLs, ShutdownTimeout: 10 * time.Second, Stream: name, StreamURL: strings.Join(c.StreamURLs, ",")}
	cons, err := New(cfg)
	require.NoError(t, err)
	cons.Handle(e.effectHandler())
	start(t, cons)
	waitFor(t, time.Minute, "the first 500 messages applied", func() bool { return len(e.effects()) == 500 })

	var reader string
	waitFor(t, time.Minute, "every member of the stream online, the reader on a replica", func() bool {
		q, err := c.Replicas(name)
		if err != nil || q.Leader == "" || len(q.Online) != len(c.Nodes) {
			return false
		}
		readers := c.StreamReaders(t)
		if len(readers) != 1 || readers[0] == q.Leader {
			return false
		}
		reader = readers[0]
		return true
	})
	c.Kill(t, reader)
	i := slices.Index(c.Nodes, reader)
	publish(slices.Delete(slices.Clone(c.StreamURLs), i, i+1), 500, 800)
	published := 800
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d messages applied with %s down", published, reader),
		func() bool { return len(e.effects()) == published })
	require.NotContains(t, c.StreamReaders(t), reader)
	counts := e.effects()
	require.Len(t, counts, published)
	for id, n := range counts {
		require.Equal(t, 1, n, "%s applied once", id)
	}
}
