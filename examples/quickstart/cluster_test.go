//go:build cluster

package main

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// The quickstart worker, run as a user runs it with the three nodes of a
// cluster in IDEM_AMQP_URL, keeps consuming after kill -9 of the node it
// is connected to (which stays down), and every balance grows by exactly
// its distinct deposits.
func TestQuickstartWorkerOutlivesTheNodeItIsConnectedTo(t *testing.T) {
	c := testcluster.Require(t)
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	schema, queue := testdb.Name(t, "qs"), testdb.Name(t, "q")
	pool, err := pgxpool.New(context.Background(), c.PGURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
		c.DeleteQueues(t, queue, queue+".retry", queue+".dlq")
	})

	var log testrun.LogBuffer
	worker := exec.Command(bin, "worker", "-queue", queue, "-schema", schema)
	worker.Env = append(os.Environ(), "IDEM_AMQP_URL="+strings.Join(c.AMQPURLs, ","), "IDEM_PG_URL="+c.PGURL)
	worker.Stdout, worker.Stderr = &log, &log
	require.NoError(t, worker.Start())
	exited := make(chan error, 1)
	go func() { exited <- worker.Wait() }()
	t.Cleanup(func() {
		_ = worker.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = worker.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", log.String())
		}
	})

	var node string
	testrun.WaitFor(t, 30*time.Second, "the worker connected", func() bool {
		for _, conn := range c.Connections(t) {
			if conn.ClientName == "idem:quickstart" {
				node = conn.Node
				return true
			}
		}
		return false
	})
	c.WaitForQueue(t, queue)
	// Deposits go through the other nodes: the publisher is not under test.
	others := slices.DeleteFunc(slices.Clone(c.AMQPURLs), func(u string) bool { return u == c.URL(t, node) })
	o := options{amqpURLs: others, queue: queue, schema: schema, n: 1500, dup: 0.3, accounts: 7}
	tables := idem.Tables{Schema: schema}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()

	first, err := publish(ctx, o, quiet)
	require.NoError(t, err)
	testrun.WaitFor(t, time.Minute, "deposits applied before the kill", func() bool {
		b, err := balances(ctx, pool, tables)
		return err == nil && len(b) > 0
	})
	c.Kill(t, node)
	second, err := publish(ctx, o, quiet)
	require.NoError(t, err)

	want := maps.Clone(first.expected)
	for a, sum := range second.expected {
		want[a] += sum
	}
	var got map[string]int64
	testrun.WaitFor(t, 2*time.Minute, "every distinct deposit applied", func() bool {
		got, _ = balances(ctx, pool, tables)
		return maps.Equal(got, want)
	})
	// Nothing arrives late and twice.
	time.Sleep(2 * time.Second)
	got, err = balances(ctx, pool, tables)
	require.NoError(t, err)
	require.Equal(t, want, got)
	select {
	case err := <-exited:
		t.Fatalf("the worker exited: %v", err)
	default:
	}
	var after []string
	for _, conn := range c.Connections(t) {
		if conn.ClientName == "idem:quickstart" {
			after = append(after, conn.Node)
		}
	}
	require.NotEmpty(t, after, "the worker is connected")
	require.NotContains(t, after, node, "the worker consumes through another node")
}
