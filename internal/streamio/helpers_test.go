package streamio

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// openEnv connects to the test broker's stream port, or ends the test the
// way testdb.Unavailable does.
func openEnv(tb testing.TB) *Env {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := Open(ctx, Config{URI: URLFromEnv()})
	if err != nil {
		testdb.Unavailable(tb, "RabbitMQ stream port", err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// newStream declares a stream unique to the test and deletes it at cleanup.
func newStream(tb testing.TB, e *Env) string {
	tb.Helper()
	name := testdb.Name(tb, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(tb, e.DeclareStream(ctx, name, StreamOptions{}))
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.DeleteStream(ctx, name); err != nil && !errors.Is(err, ErrStreamNotFound) {
			tb.Logf("delete stream %s: %v", name, err)
		}
	})
	return name
}

// messages returns n messages with ids prefix-0 … prefix-(n-1).
func messages(prefix string, n int) []Outgoing {
	out := make([]Outgoing, n)
	for i := range out {
		out[i] = Outgoing{MessageID: fmt.Sprintf("%s-%d", prefix, i), Body: []byte(fmt.Sprintf("body %s %d", prefix, i))}
	}
	return out
}

// collector gathers what fn receives, checking batch sizes and order.
type collector struct {
	tb       testing.TB
	maxBatch int
	mu       sync.Mutex
	records  []Record
	batches  int
}

func (c *collector) fn(_ context.Context, batch []Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	if c.maxBatch > 0 && len(batch) > c.maxBatch {
		c.tb.Errorf("batch of %d records, max %d", len(batch), c.maxBatch)
	}
	for _, r := range batch {
		if n := len(c.records); n > 0 && r.Offset != c.records[n-1].Offset+1 {
			c.tb.Errorf("offset %d follows %d", r.Offset, c.records[n-1].Offset)
		}
		c.records = append(c.records, r)
	}
	return nil
}

func (c *collector) snapshot() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.records...)
}

func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.MessageID
	}
	return out
}

func idsOf(msgs []Outgoing) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.MessageID
	}
	return out
}

// requireConnectionLost requires Follow or Read, which returns on done, to
// end with ErrConnectionLost within 10 seconds; stuck is the failure when
// it does not return.
func requireConnectionLost(tb testing.TB, done <-chan error, stuck string) {
	tb.Helper()
	select {
	case err := <-done:
		require.ErrorIs(tb, err, ErrConnectionLost)
	case <-time.After(10 * time.Second):
		tb.Fatal(stuck)
	}
}

// proxyURI is URLFromEnv with the host replaced by the proxy's address.
func proxyURI(tb testing.TB, p *testbroker.Proxy) string {
	u, err := url.Parse(URLFromEnv())
	require.NoError(tb, err)
	u.Host = p.Addr()
	return u.String()
}
