package streamio

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchStream publishes n small messages to a fresh stream.
func benchStream(b *testing.B, e *Env, n int) string {
	b.Helper()
	name := newStream(b, e)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const per = 10_000
	for i := 0; i < n; i += per {
		msgs := make([]Outgoing, min(per, n-i))
		for j := range msgs {
			msgs[j] = Outgoing{MessageID: fmt.Sprintf("m-%d", i+j), Body: []byte(`{"n":1}`)}
		}
		require.NoError(b, e.Publish(ctx, name, msgs))
	}
	return name
}

// readAll reads the whole stream with a no-op fn and reports msg/s.
func readAll(b *testing.B, e *Env, name string, n int) {
	b.Helper()
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		read := 0
		err := e.Read(ctx, ReadSpec{Stream: name}, func(_ context.Context, batch []Record) error {
			read += len(batch)
			return nil
		})
		require.NoError(b, err)
		require.Equal(b, n, read)
	}
	b.ReportMetric(float64(n*b.N)/time.Since(start).Seconds(), "msg/s")
}

// BenchmarkRawRead reads 200,000 small messages with a no-op fn. It guards
// the SetReadBuffer(0) fix: without it the client reads a few hundred
// messages per second (see BenchmarkRawReadClientDefaultBuffer).
func BenchmarkRawRead(b *testing.B) {
	const n = 200_000
	e := openEnv(b)
	readAll(b, e, benchStream(b, e, n), n)
}

// BenchmarkRawReadClientDefaultBuffer is the baseline: the client's default
// 8 KiB socket read buffer. Only 2,000 messages, since it is that slow.
func BenchmarkRawReadClientDefaultBuffer(b *testing.B) {
	const n = 2_000
	e := openEnv(b)
	name := benchStream(b, e, n)
	e.readBuffer = 8192 // what the client sets unless told otherwise
	readAll(b, e, name, n)
}
