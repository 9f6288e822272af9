package ledger_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/ledger"
)

// BenchmarkDispatchHTTP measures how many effects per second a dispatcher
// carries out against a local HTTP stub (claim, call, outcome write), and,
// in the same run, plain POSTs to the same stub from the same concurrency
// without the ledger. Run with a fixed count, e.g. -benchtime 20000x.
func BenchmarkDispatchHTTP(b *testing.B) {
	const concurrency = 128
	f := newFixture(b)
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(stub.Close)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	n := b.N
	body := []byte(`{"to":"ada@example.com","template":"order-confirmation"}`)

	// Baseline: n plain POSTs, concurrency at a time.
	baseline := measure(func() {
		var wg sync.WaitGroup
		work := make(chan int)
		for range concurrency {
			wg.Go(func() {
				for range work {
					resp, err := client.Post(stub.URL, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
	})

	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		require.NoError(b, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			for i := start; i < min(start+1000, n); i++ {
				if _, err := f.ledger.Record(ctx, tx, ledger.Effect{Type: "mail", BusinessKey: fmt.Sprint(i), Target: stub.URL, Request: body}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{
		Pool: f.pool, Tables: f.tables, Concurrency: concurrency, BatchSize: 200,
		Executors: map[string]ledger.Executor{"mail": &ledger.HTTPExecutor{Client: client}},
		Logger:    slog.New(slog.DiscardHandler),
	})
	require.NoError(b, err)
	pending := "SELECT EXISTS (SELECT 1 FROM " + f.tables.Table("ledger") + " WHERE status IN ('pending', 'failed_retryable'))" +
		" OR EXISTS (SELECT 1 FROM " + f.tables.Table("ledger") + " WHERE status = 'in_flight')"

	b.ResetTimer()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	elapsed := measure(func() {
		go func() { done <- d.Run(runCtx) }()
		for {
			var busy bool
			require.NoError(b, f.pool.QueryRow(ctx, pending).Scan(&busy))
			if !busy {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	b.StopTimer()
	stop()
	require.NoError(b, <-done)

	var succeeded int
	require.NoError(b, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.tables.Table("ledger")+" WHERE status = 'succeeded'").Scan(&succeeded))
	require.Equal(b, n, succeeded)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "effects/s")
	b.ReportMetric(float64(n)/baseline.Seconds(), "plain_posts/s")
	b.ReportMetric(baseline.Seconds()/elapsed.Seconds(), "ratio")
}

func measure(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}
