package consumer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// brokerModel settles tags as RabbitMQ does: a multiple ack settles every
// outstanding tag up to its own, which must itself be outstanding (else the
// broker closes the channel: "unknown delivery tag").
type brokerModel struct {
	outstanding map[uint64]bool
	acked       map[uint64]bool
	requeued    map[uint64]bool
	frames      []string
}

func newBrokerModel(n int) *brokerModel {
	b := &brokerModel{outstanding: map[uint64]bool{}, acked: map[uint64]bool{}, requeued: map[uint64]bool{}}
	for tag := uint64(1); tag <= uint64(n); tag++ {
		b.outstanding[tag] = true
	}
	return b
}

func (b *brokerModel) Ack(tag uint64, multiple bool) error {
	b.frames = append(b.frames, fmt.Sprintf("ack %d %v", tag, multiple))
	if !b.outstanding[tag] {
		return fmt.Errorf("PRECONDITION_FAILED - unknown delivery tag %d", tag)
	}
	if !multiple {
		delete(b.outstanding, tag)
		b.acked[tag] = true
		return nil
	}
	for t := range b.outstanding {
		if t <= tag {
			delete(b.outstanding, t)
			b.acked[t] = true
		}
	}
	return nil
}

func (b *brokerModel) Nack(tag uint64, multiple, requeue bool) error {
	b.frames = append(b.frames, fmt.Sprintf("nack %d", tag))
	if multiple || !requeue || !b.outstanding[tag] {
		return fmt.Errorf("unexpected nack %d multiple=%v requeue=%v", tag, multiple, requeue)
	}
	delete(b.outstanding, tag)
	b.requeued[tag] = true
	return nil
}

// deliveredAcker is an acker over b to which n deliveries were made.
func deliveredAcker(b *brokerModel, prefetch int) *acker {
	a := newAcker(b, prefetch)
	for tag := uint64(1); tag <= uint64(len(b.outstanding)); tag++ {
		a.deliver(tag)
	}
	return a
}

func TestAckerSendsOneMultipleAckPerBatchInOrder(t *testing.T) {
	b := newBrokerModel(6)
	a := deliveredAcker(b, 100)
	for _, batch := range [][]uint64{{1, 2, 3}, {4, 5, 6}} {
		if err := a.settle(batch, nil); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"ack 3 true", "ack 6 true"}; !slices.Equal(b.frames, want) {
		t.Fatalf("frames %v, want %v", b.frames, want)
	}
}

func TestAckerNeverAcksATagAboveAnUnsettledOne(t *testing.T) {
	b := newBrokerModel(6)
	a := deliveredAcker(b, 100)
	// The second batch finishes first: its acks wait for the first.
	if err := a.settle([]uint64{4, 5, 6}, nil); err != nil {
		t.Fatal(err)
	}
	if len(b.frames) != 0 {
		t.Fatalf("acked %v while tags 1-3 were unsettled", b.frames)
	}
	// The first batch hands message 2 back: the nack goes out before the
	// multiple ack that covers it.
	if err := a.settle([]uint64{1, 3}, []uint64{2}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"nack 2", "ack 6 true"}; !slices.Equal(b.frames, want) {
		t.Fatalf("frames %v, want %v", b.frames, want)
	}
	if !b.requeued[2] || b.acked[2] {
		t.Fatal("message 2 was acked instead of handed back")
	}
}

func TestAckerFlushLeavesUnstartedDeliveriesUnacked(t *testing.T) {
	b := newBrokerModel(5)
	a := deliveredAcker(b, 100)
	// Tags 1 and 4 were never started (shutdown); 2, 3 and 5 committed.
	if err := a.settle([]uint64{2, 3}, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.settle([]uint64{5}, nil); err != nil {
		t.Fatal(err)
	}
	if len(b.frames) != 0 {
		t.Fatalf("acked %v above unsettled tag 1", b.frames)
	}
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if b.acked[1] || b.acked[4] || !b.outstanding[1] || !b.outstanding[4] {
		t.Fatalf("unstarted deliveries settled: acked %v", b.acked)
	}
	for _, tag := range []uint64{2, 3, 5} {
		if !b.acked[tag] {
			t.Fatalf("committed tag %d not acked after flush", tag)
		}
	}
	for _, f := range b.frames {
		if f != "ack 2 false" && f != "ack 3 false" && f != "ack 5 false" {
			t.Fatalf("flush sent %q", f)
		}
	}
}

func TestAckerAcksOneByOneWhenASlowBatchHoldsTooMany(t *testing.T) {
	b := newBrokerModel(10)
	a := deliveredAcker(b, 8) // at most 4 acks wait
	a.hold = 0                // tag 1 has been stuck long enough
	if err := a.settle([]uint64{2, 3, 4, 5}, nil); err != nil {
		t.Fatal(err)
	}
	if len(b.frames) != 0 {
		t.Fatalf("frames %v before the limit", b.frames)
	}
	if err := a.settle([]uint64{6}, nil); err != nil {
		t.Fatal(err)
	}
	// Over the limit: the oldest go one by one until at most 2 wait.
	if want := []string{"ack 2 false", "ack 3 false", "ack 4 false"}; !slices.Equal(b.frames, want) {
		t.Fatalf("frames %v, want %v while tag 1 is in a batch", b.frames, want)
	}
	// Tag 1 finishes: one multiple ack for it and the two still waiting.
	b.frames = nil
	if err := a.settle([]uint64{1}, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ack 6 true"}; !slices.Equal(b.frames, want) {
		t.Fatalf("frames %v, want %v", b.frames, want)
	}
	if err := a.settle([]uint64{7}, nil); err != nil {
		t.Fatal(err)
	}
	if !b.acked[7] || len(b.outstanding) != 3 {
		t.Fatalf("tag 7 not acked at once: outstanding %v", b.outstanding)
	}
}

// A delivery that settles within the hold (a message that left its batch
// and runs in its worker's next one) keeps the acks above it waiting for
// one multiple ack instead of a frame each.
func TestAckerLetsAcksWaitForADeliveryThatSettlesWithinTheHold(t *testing.T) {
	b := newBrokerModel(10)
	a := deliveredAcker(b, 8) // at most 4 acks wait
	a.hold = time.Hour
	require.NoError(t, a.settle([]uint64{2, 3, 4, 5, 6, 7}, nil))
	require.Empty(t, b.frames, "over the limit, but tag 1 has not been stuck for the hold")
	require.NoError(t, a.settle([]uint64{1}, nil))
	require.Equal(t, []string{"ack 7 true"}, b.frames)
}

// Once the lowest delivery has not settled for the hold, the acks above it
// go out one by one even when no batch settles anything more (every
// worker waits for the window to open): a hung batch holds the window only
// for the hold.
func TestAckerAcksOneByOneWhenTheHoldEndsWithoutASettle(t *testing.T) {
	b := newBrokerModel(10)
	a := deliveredAcker(b, 8) // at most 4 acks wait
	a.hold = 50 * time.Millisecond
	require.NoError(t, a.settle([]uint64{2, 3, 4, 5, 6}, nil))
	frames := func() []string {
		a.mu.Lock() // the hold's timer calls Ack under it
		defer a.mu.Unlock()
		return slices.Clone(b.frames)
	}
	require.Empty(t, frames(), "within the hold")
	require.Eventually(t, func() bool { return len(frames()) > 0 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"ack 2 false", "ack 3 false", "ack 4 false"}, frames())
	require.NoError(t, a.settle([]uint64{7}, nil))
	require.Equal(t, []string{"ack 2 false", "ack 3 false", "ack 4 false"}, frames(),
		"below the limit again: tag 7 waits for tag 1")
	require.NoError(t, a.flush())
}

func TestAckerAcksAtOnceAfterFlush(t *testing.T) {
	b := newBrokerModel(4)
	a := deliveredAcker(b, 100)
	require.NoError(t, a.settle([]uint64{2}, nil))
	require.NoError(t, a.flush()) // tag 1 will never be settled here
	require.Equal(t, []string{"ack 2 false"}, b.frames)
	require.NoError(t, a.settle([]uint64{4}, nil))
	require.Equal(t, []string{"ack 2 false", "ack 4 false"}, b.frames, "after flush, acks go out at once")
	require.Zero(t, a.unsent())
}

func TestAckerCountsAcksItCouldNotSend(t *testing.T) {
	b := newBrokerModel(3)
	a := deliveredAcker(b, 100)
	require.NoError(t, a.settle([]uint64{2, 3}, nil)) // waiting behind tag 1
	require.Equal(t, 2, a.unsent())
	b.outstanding = map[uint64]bool{} // the channel died: every frame fails
	require.Error(t, a.flush())
	require.Equal(t, 2, a.unsent(), "the acks that were not sent are still counted")
}

// TestAckerKeepsNoStateForSettledTags: a batch stuck on the lowest tag
// while thousands of others are settled leaves the acker with what the
// prefetch window bounds, not one entry per message since.
func TestAckerKeepsNoStateForSettledTags(t *testing.T) {
	const n = 10000
	b := newBrokerModel(n)
	a := newAcker(b, 100)
	a.hold = 0   // stuck for longer than the hold
	a.deliver(1) // stuck in a batch
	for tag := uint64(2); tag <= n; tag++ {
		a.deliver(tag)
		require.NoError(t, a.settle([]uint64{tag}, nil))
	}
	a.mu.Lock()
	state := len(a.unsettled) + len(a.waiting)
	a.mu.Unlock()
	require.LessOrEqual(t, state, 51, "unsettled + waiting")
	require.NoError(t, a.settle([]uint64{1}, nil))
	require.Len(t, b.outstanding, 0)
}

// TestAckerSettlesConcurrentBatches settles batches from several
// goroutines at once (run with -race): every tag ends acked.
func TestAckerSettlesConcurrentBatches(t *testing.T) {
	const n, workers = 4000, 4
	b := newBrokerModel(n)
	var mu sync.Mutex // the model is not safe for concurrent use; the acker serialises its calls anyway
	a := deliveredAcker(b, 1000)
	a.ch = lockedChannel{&mu, b}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := uint64(1 + w*10); start <= n; start += workers * 10 {
				var batch []uint64
				for tag := start; tag < start+10 && tag <= n; tag++ {
					batch = append(batch, tag)
				}
				if err := a.settle(batch, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, b.outstanding, 0)
	require.Len(t, b.acked, n)
}

type lockedChannel struct {
	mu *sync.Mutex
	b  *brokerModel
}

func (l lockedChannel) Ack(tag uint64, multiple bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Ack(tag, multiple)
}

func (l lockedChannel) Nack(tag uint64, multiple, requeue bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Nack(tag, multiple, requeue)
}

// TestAckerSettlesEveryTagAsAsked runs random batches, finished in random
// order, with random nacks and deliveries left unsettled, against the broker
// model: every tag ends exactly as the runtime asked, and no frame is
// refused.
func TestAckerSettlesEveryTagAsAsked(t *testing.T) {
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := 1 + rng.IntN(200)
		b := newBrokerModel(n)
		a := deliveredAcker(b, 1+rng.IntN(64))
		var batches [][]uint64
		for tag := uint64(1); tag <= uint64(n); {
			size := 1 + rng.IntN(20)
			var batch []uint64
			for ; size > 0 && tag <= uint64(n); size-- {
				batch = append(batch, tag)
				tag++
			}
			batches = append(batches, batch)
		}
		rng.Shuffle(len(batches), func(i, j int) { batches[i], batches[j] = batches[j], batches[i] })
		want := map[uint64]string{}
		for _, batch := range batches {
			if rng.IntN(10) == 0 {
				for _, tag := range batch {
					want[tag] = "left" // never started: shutdown
				}
				continue
			}
			var acks, nacks []uint64
			for _, tag := range batch {
				if rng.IntN(8) == 0 {
					nacks, want[tag] = append(nacks, tag), "requeued"
				} else {
					acks, want[tag] = append(acks, tag), "acked"
				}
			}
			if err := a.settle(acks, nacks); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if err := a.flush(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for tag, w := range want {
			got := "left"
			switch {
			case b.acked[tag]:
				got = "acked"
			case b.requeued[tag]:
				got = "requeued"
			}
			if got != w {
				t.Fatalf("seed %d: tag %d %s, want %s (frames %v)", seed, tag, got, w, b.frames)
			}
		}
	}
}

// TestAckerMultipleAckSkipsANackedTagOnRabbitMQ checks the broker behaviour
// the acker relies on, against the real broker: after a nack with requeue,
// a multiple ack above it settles the others and leaves the channel open,
// and the nacked message comes back.
func TestAckerMultipleAckSkipsANackedTagOnRabbitMQ(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	for i := 1; i <= 6; i++ {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", q, false, false,
			amqp.Publishing{MessageId: strconv.Itoa(i), Body: []byte{byte(i)}}))
	}
	cch := testbroker.Channel(t)
	require.NoError(t, cch.Qos(10, 0, false))
	deliveries, err := cch.Consume(q, "", false, false, false, false, nil)
	require.NoError(t, err)
	a := newAcker(cch, 10)
	tags := map[string]uint64{}
	for len(tags) < 6 {
		d := <-deliveries
		a.deliver(d.DeliveryTag)
		tags[d.MessageId] = d.DeliveryTag
	}
	require.NoError(t, a.settle([]uint64{tags["4"], tags["5"], tags["6"]}, nil))
	require.NoError(t, a.settle([]uint64{tags["1"], tags["3"]}, []uint64{tags["2"]}))
	select {
	case d := <-deliveries:
		require.Equal(t, "2", d.MessageId, "only the nacked message comes back")
		require.True(t, d.Redelivered)
		require.NoError(t, d.Ack(false))
	case <-time.After(5 * time.Second):
		t.Fatal("the nacked message was not redelivered")
	}
	require.Eventually(t, func() bool {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err == nil && info.Messages == 0
	}, 5*time.Second, 50*time.Millisecond, "every message settled")
	require.False(t, cch.IsClosed(), "the broker accepted every frame")
}

// A delivery held back for a retry's backoff (parked) is the lowest
// unsettled one for that long: the acks above it go out one by one at
// once instead of waiting for a multiple ack, and once it settles the
// multiple acks resume.
func TestAckerAcksAroundAParkedDeliveryOneByOne(t *testing.T) {
	b := newBrokerModel(6)
	a := deliveredAcker(b, 100)
	require.NoError(t, a.settle([]uint64{1}, nil))
	require.NoError(t, a.park(2))
	require.NoError(t, a.settle([]uint64{3, 4}, nil))
	require.Equal(t, []string{"ack 1 true", "ack 3 false", "ack 4 false"}, b.frames)
	require.NoError(t, a.settle([]uint64{2}, nil))
	require.NoError(t, a.settle([]uint64{5, 6}, nil))
	require.Equal(t, []string{"ack 1 true", "ack 3 false", "ack 4 false", "ack 2 true", "ack 6 true"}, b.frames)
	require.Empty(t, b.outstanding)
}
