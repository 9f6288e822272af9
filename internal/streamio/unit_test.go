package streamio

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/streamclient/amqp"
)

func recs(offsets ...int64) []Record {
	out := make([]Record, len(offsets))
	for i, o := range offsets {
		out[i] = Record{Message: idem.Message{Offset: o}}
	}
	return out
}

func offsets(rs []Record) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.Offset
	}
	return out
}

func TestWindowCutStopsAtEndAndDropsRestOfChunk(t *testing.T) {
	t.Parallel()
	w := window{from: 3, end: 7}

	keep, done := w.cut(recs(0, 1, 2, 3, 4))
	require.Equal(t, []int64{3, 4}, offsets(keep))
	require.False(t, done)

	keep, done = w.cut(recs(5, 6, 7, 8, 9))
	require.Equal(t, []int64{5, 6, 7}, offsets(keep))
	require.True(t, done)

	// The end may be missing (a gap): the first record past it ends the read.
	keep, done = w.cut(recs(8, 9))
	require.Empty(t, keep)
	require.True(t, done)
}

func TestWindowFiltersByCreationTimeButKeepsUntimedRecords(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	w := window{from: 0, end: 100, notBefore: t0, notAfter: t0.Add(time.Minute)}
	batch := []Record{
		{Message: idem.Message{Offset: 0, Timestamp: t0.Add(-time.Millisecond)}}, // before From
		{Message: idem.Message{Offset: 1, Timestamp: t0}},                        // at From: kept
		{Message: idem.Message{Offset: 2}},                                       // no creation time: kept
		{Message: idem.Message{Offset: 3, Timestamp: t0.Add(time.Minute)}},       // at To: kept
		{Message: idem.Message{Offset: 4, Timestamp: t0.Add(time.Minute + 1)}},   // after To
	}
	keep, done := w.cut(batch)
	require.Equal(t, []int64{1, 2, 3}, offsets(keep))
	require.False(t, done)
}

func TestEmptyWindow(t *testing.T) {
	t.Parallel()
	require.True(t, window{from: 5, end: 4}.empty())
	require.False(t, window{from: 5, end: 5}.empty())
}

func TestValidateRejectsNonsense(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name string
		spec ReadSpec
		want error
	}{
		{"no stream", ReadSpec{}, ErrInvalidSpec},
		{"negative batch", ReadSpec{Stream: "s", MaxBatch: -1}, ErrInvalidSpec},
		{"tail as start", ReadSpec{Stream: "s", From: Tail()}, ErrInvalidSpec},
		{"first as end", ReadSpec{Stream: "s", To: First()}, ErrInvalidSpec},
		{"negative offset", ReadSpec{Stream: "s", From: Offset(-1)}, ErrInvalidSpec},
		{"offsets reversed", ReadSpec{Stream: "s", From: Offset(5), To: Offset(4)}, ErrEndBeforeStart},
		{"times reversed", ReadSpec{Stream: "s", From: Time(now.Add(-time.Second)), To: Time(now.Add(-time.Hour))}, ErrEndBeforeStart},
		{"start in future", ReadSpec{Stream: "s", From: Time(now.Add(time.Minute))}, ErrStartInFuture},
	}
	for _, c := range cases {
		_, err := c.spec.validate(now)
		require.ErrorIs(t, err, c.want, c.name)
	}

	spec, err := ReadSpec{Stream: "s", From: Offset(5), To: Offset(5)}.validate(now)
	require.NoError(t, err)
	require.Equal(t, DefaultMaxBatch, spec.MaxBatch)

	spec, err = ReadSpec{Stream: "s"}.validate(now)
	require.NoError(t, err)
	require.Equal(t, First(), spec.From)
	require.Equal(t, Tail(), spec.To)
}

func TestBufferBlocksProducerWhileFullAndHandsOverInOrder(t *testing.T) {
	t.Parallel()
	b := newBuffer(3)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range int64(10) {
			b.put(Record{Message: idem.Message{Offset: i}})
		}
	}()
	var got []int64
	for len(got) < 10 {
		<-b.ready
		batch := b.take()
		require.LessOrEqual(t, len(batch), 3)
		got = append(got, offsets(batch)...)
	}
	wg.Wait()
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, got)
}

func TestBufferStopReleasesBlockedProducer(t *testing.T) {
	t.Parallel()
	b := newBuffer(1)
	b.put(Record{Message: idem.Message{Offset: 0}})
	done := make(chan struct{})
	go func() {
		b.put(Record{Message: idem.Message{Offset: 1}}) // full: blocks until stop
		b.put(Record{Message: idem.Message{Offset: 2}}) // stopped: returns at once
		close(done)
	}()
	b.stop()
	<-done
	require.Equal(t, []int64{0}, offsets(b.take()))
}

func TestToRecordReadsAMQPFields(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &amqp.Message{
		Properties: &amqp.MessageProperties{
			MessageID: uint64(42), CorrelationID: []byte("c"), ContentType: "text/plain", CreationTime: created,
		},
		ApplicationProperties: map[string]any{"k": "v"},
		Data:                  [][]byte{[]byte("ab"), []byte("cd")},
	}
	r := toRecord(7, m)
	require.Equal(t, Record{Message: idem.Message{
		Offset: 7, HasOffset: true, Timestamp: created, MessageID: "42", ContentType: "text/plain", CorrelationID: "c",
		Headers: map[string]any{"k": "v"}, Body: []byte("abcd"),
	}}, r)

	require.Equal(t, []byte("v"), toRecord(0, &amqp.Message{Value: "v"}).Body)
}

// A record the client could not decode becomes a record that says so,
// its body the bytes it could read, and nothing else but its offset.
func TestToRecordOfAnUndecodableRecordKeepsItsBytesAndWhy(t *testing.T) {
	t.Parallel()
	why := &amqp.DecodeError{Record: []byte("junk"), Err: errors.New("bad")}
	r := toRecord(9, &amqp.Message{DecodeError: why})
	require.Equal(t, Record{Message: idem.Message{Offset: 9, HasOffset: true, Body: []byte("junk")}, Undecodable: why}, r)
	msgs := Messages("s", []Record{r}, time.Time{})
	require.Equal(t, []byte("junk"), msgs[0].Body)
	require.Empty(t, msgs[0].MessageID)
}

func TestStreamURLDerivesFromAMQPURL(t *testing.T) {
	t.Parallel()
	got, err := StreamURL("amqp://guest:guest@127.0.0.1:5672/")
	require.NoError(t, err)
	require.Equal(t, "rabbitmq-stream://guest:guest@127.0.0.1:5552/", got)

	got, err = StreamURL("amqps://u:p@mq.example.com/prod")
	require.NoError(t, err)
	require.Equal(t, "rabbitmq-stream+tls://u:p@mq.example.com:5552/prod", got)

	_, err = StreamURL("http://x")
	require.Error(t, err)
}

func TestErrorsNeverShowThePassword(t *testing.T) {
	t.Parallel()
	require.Equal(t, "rabbitmq-stream://guest:xxxxx@h:5552/", Redact("rabbitmq-stream://guest:s3cret@h:5552/"))

	_, err := StreamURL("amqp://u:s3cret@h:bad port/")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	_, err = environmentOptions(Config{}, 0, "amqp://u:s3cret@h/", 1)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

func TestOpenWithWrongPasswordDoesNotLeakIt(t *testing.T) {
	t.Parallel()
	openEnv(t) // skips or fails when the broker is unreachable
	u, err := url.Parse(URLFromEnv())
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "wrong-s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Open(ctx, Config{URI: u.String()})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "wrong-s3cret")
	require.True(t, strings.Contains(err.Error(), "xxxxx"), err.Error())
}

func TestLoopbackURIPinsConnectionsToItsHost(t *testing.T) {
	t.Parallel()
	opts, err := environmentOptions(Config{}, 0, "rabbitmq-stream://guest:guest@127.0.0.1:5552/", 1)
	require.NoError(t, err)
	require.NotNil(t, opts.AddressResolver)
	require.Equal(t, "127.0.0.1", opts.AddressResolver.Host)
	require.Equal(t, 5552, opts.AddressResolver.Port)
	require.Zero(t, opts.TCPParameters.ReadBuffer, "the kernel must autotune the read buffer")

	opts, err = environmentOptions(Config{}, 0, "rabbitmq-stream://guest:guest@mq.example.com:5552/", 1)
	require.NoError(t, err)
	require.Nil(t, opts.AddressResolver)

	opts, err = environmentOptions(Config{PinHost: true}, 0, "rabbitmq-stream://guest:guest@mq.example.com/", 1)
	require.NoError(t, err)
	require.Equal(t, DefaultStreamPort, opts.AddressResolver.Port)
}

// No node of a list is pinned, PinHost or not: a cluster's members are
// reached where they advertise themselves, since the client retries
// without end a consumer or producer connection that lands on another
// member than the one it chose.
func TestNoNodeOfAListIsPinned(t *testing.T) {
	t.Parallel()
	nodes, err := splitURIs("rabbitmq-stream://g:g@127.0.0.1:5561/, rabbitmq-stream://g:g@127.0.0.1:5562/")
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	for _, n := range nodes {
		for _, cfg := range []Config{{}, {PinHost: true}} {
			opts, err := environmentOptions(cfg, 0, n, len(nodes))
			require.NoError(t, err)
			require.Nil(t, opts.AddressResolver, "consumers and producers go to the members the broker advertises")
		}
	}
	_, err = splitURIs("rabbitmq-stream://g:s3cret@h1/,")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	uris, err := StreamURLs([]string{"amqp://u:p@h1:5681/v", "amqps://u:p@h2/"})
	require.NoError(t, err)
	require.Equal(t, "rabbitmq-stream://u:p@h1:5552/v,rabbitmq-stream+tls://u:p@h2:5552/", uris)
}
