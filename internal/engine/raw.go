package engine

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Raw is a message as a source received it, before the consumer derives
// its identity: the fields are those of consumer.Incoming, so that one
// converts to the other.
type Raw struct {
	MessageID     string
	Body          []byte
	Headers       map[string]any
	ContentType   string
	CorrelationID string
	Exchange      string
	RoutingKey    string
	Redelivered   bool
	DeliveryCount int64
	Attempt       int
	Source        string
	Offset        int64
	HasOffset     bool
	Timestamp     time.Time
	ReceivedAt    time.Time
}

// prepareChunk is the smallest share of a batch prepared on a goroutine of
// its own.
const prepareChunk = 256

// PrepareAll runs prepare over raws. A large batch (a stream's, a replay's)
// is split over the CPUs: deriving hashes, ids and business keys (often a
// JSON decode) is the largest part of the runtime's own CPU per message
// there, and the database is idle meanwhile.
func PrepareAll(raws []Raw, prepare func(*Raw) *Item) []*Item {
	out := make([]*Item, len(raws))
	parts := min(runtime.GOMAXPROCS(0), len(raws)/prepareChunk)
	if parts <= 1 {
		for i := range raws {
			out[i] = prepare(&raws[i])
		}
		return out
	}
	size := (len(raws) + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := 0; lo < len(raws); lo += size {
		hi := min(lo+size, len(raws))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				out[i] = prepare(&raws[i])
			}
		})
	}
	wg.Wait()
	return out
}

// Lag is a stream consumer's position: the last committed checkpoint and
// the last sampled tail, for the lag metric and Stats.
type Lag struct {
	Checkpoint, Tail atomic.Int64
}

// Value is the tail minus the checkpoint; ok is false before either is known.
func (l *Lag) Value() (int64, bool) {
	if l.Tail.Load() == 0 && l.Checkpoint.Load() == 0 {
		return 0, false
	}
	return max(l.Tail.Load()-l.Checkpoint.Load(), 0), true
}
