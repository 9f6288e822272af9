package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cpustat"
	"github.com/idemkit/idem/replay"
)

// benchEvents is how many order events the rebuild benchmark publishes
// (duplicates come on top).
const benchEvents = 100_000

// BenchmarkRebuildOf100kEvents publishes 100,000 order events (3 % of them
// twice) and measures, in the same run and with the same handler (the
// version guard, the upsert, the e-mail effect): live consumption of the
// whole stream by the consumer's Run (no dispatcher), then an online rebuild of
// order_overview beside that live consumer, which keeps running. It reports
// both rates, their ratio, how long the swap held the live consumer, and
// the CPU steal (a run with a high steal is depressed and noisy).
//
//	go test ./examples/orders -run '^$' -bench RebuildOf100k -benchtime 1x
func BenchmarkRebuildOf100kEvents(b *testing.B) {
	e := newTestEnv(b)
	sent := e.publish(publishConfig{n: benchEvents, dup: 0.03, swap: 0.02, seed: 100})
	tail := int64(len(sent) - 1)
	cpu := cpustat.Read()
	live, stop := benchLive(b, e, tail)
	defer stop()
	liveRate := float64(len(sent)) / live.Seconds()
	b.ResetTimer()
	var rebuilt time.Duration
	var pause time.Duration
	for range b.N {
		s := benchRebuild(b, e)
		require.EqualValues(b, len(sent), s.Messages)
		rebuilt += s.Elapsed
		pause += s.Pause
	}
	b.StopTimer()
	rebuildRate := float64(len(sent)) * float64(b.N) / rebuilt.Seconds()
	b.ReportMetric(liveRate, "live_msg/s")
	b.ReportMetric(rebuildRate, "rebuild_msg/s")
	b.ReportMetric(rebuildRate/liveRate, "ratio")
	b.ReportMetric(float64(pause.Milliseconds())/float64(b.N), "pause_ms")
	b.ReportMetric(cpustat.Read().StealSince(cpu), "steal%")
	e.requireProjection(sent)
}

// benchLive consumes the stream from the start with c until its checkpoint
// is at tail and returns how long that took; the consumer keeps running
// until stop is called.
func benchLive(b *testing.B, e *testEnv, tail int64) (took time.Duration, stop func()) {
	overview, err := newOverview(e.o)
	require.NoError(b, err)
	c, err := newConsumer(e.o, e.pool, overview)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	for e.checkpoint() < tail {
		time.Sleep(5 * time.Millisecond)
	}
	took = time.Since(start)
	return took, func() {
		cancel()
		require.NoError(b, <-done)
	}
}

// benchRebuild rebuilds order_overview online and returns the summary.
func benchRebuild(b *testing.B, e *testEnv) replay.Summary {
	overview, err := newOverview(e.o)
	require.NoError(b, err)
	c, err := newConsumer(e.o, e.pool, overview)
	require.NoError(b, err)
	s, err := replay.Run(context.Background(), c, replay.Options{Mode: idem.Rebuild, Projection: overview})
	require.NoError(b, err)
	require.True(b, s.Swapped)
	return s
}
