package main

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The api and the worker of a fresh deployment start at the same moment on
// a schema nobody created: each migrates it and creates the example's
// tables, and neither fails.
func TestAPIAndWorkerStartTogetherOnAFreshSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Name(t, "fresh")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+idem.Tables{Schema: schema}.QuotedSchema()+" CASCADE")
	})
	const processes = 6
	errs := make([]error, processes)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range processes {
		wg.Go(func() {
			svc := &services{pgURL: testdb.URL(), amqpURL: testbroker.URL(), schema: schema}
			<-start
			p, _, err := svc.open(context.Background())
			if err == nil {
				p.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('payments', 'api_captures', 'gateway_events')`, schema).Scan(&n))
	require.Equal(t, 3, n)
}
