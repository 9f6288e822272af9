package testbroker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/streamclient/amqp"
	"github.com/idemkit/idem/internal/streamclient/stream"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// MapKeyedRecord is a stream record whose message annotations have a map
// as a key, with a message-id (poison-1) and a body: the Go stream client
// as released panics on its reading goroutine when it decodes it (hash of
// unhashable type), which ends the process, and every restart reads it
// again.
var MapKeyedRecord = []byte{
	0x00, 0x53, 0x72, 0xc1, 0x07, 0x02, // message-annotations: map8 of 2 items
	0xc1, 0x01, 0x00, // key: an empty map8
	0xa1, 0x01, 'x', // value: str8 "x"
	0x00, 0x53, 0x73, 0xc0, 0x0b, 0x01, 0xa1, 0x08, 'p', 'o', 'i', 's', 'o', 'n', '-', '1', // properties: message-id
	0x00, 0x53, 0x75, 0xa0, 0x04, 'b', 'o', 'd', 'y', // data: "body"
}

// GarbageRecord is a stream record that is not an AMQP 1.0 message.
var GarbageRecord = []byte("not an AMQP 1.0 message")

// Record is a stream record the client decodes: message id, body, and
// application properties (which a publisher sets at will).
func Record(tb testing.TB, id string, body []byte, props map[string]any) []byte {
	tb.Helper()
	m := amqp.NewMessage(body)
	m.Properties = &amqp.MessageProperties{MessageID: id}
	m.ApplicationProperties = props
	b, err := m.MarshalBinary()
	require.NoError(tb, err)
	return b
}

// PublishRecords appends recs to streamName, over the stream protocol at
// uri (streamio.URLFromEnv), as they are, in one batch of the producer (so
// usually one chunk), and waits for their confirms:
// RabbitMQ stores what the stream protocol brings without reading it. An
// unreachable stream port skips the test, or fails it under CI=true.
func PublishRecords(tb testing.TB, uri, streamName string, recs ...[]byte) {
	tb.Helper()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(uri))
	if err != nil {
		testdb.Unavailable(tb, "RabbitMQ stream port", err)
	}
	defer func() { _ = env.Close() }()
	p, err := env.NewProducer(streamName, nil)
	require.NoError(tb, err)
	confirms := p.NotifyPublishConfirmation()
	for _, b := range recs {
		require.NoError(tb, p.Send(&rawRecord{b: b}))
	}
	for confirmed := 0; confirmed < len(recs); {
		select {
		case c := <-confirms:
			for _, m := range c {
				require.True(tb, m.IsConfirmed())
			}
			confirmed += len(c)
		case <-time.After(10 * time.Second):
			tb.Fatalf("%d of %d raw records confirmed", confirmed, len(recs))
		}
	}
	require.NoError(tb, p.Close())
}

// rawRecord is a stream message whose bytes are b, whatever they are.
type rawRecord struct {
	amqp.Message
	b   []byte
	id  int64
	has bool
}

func (r *rawRecord) MarshalBinary() ([]byte, error)                { return r.b, nil }
func (r *rawRecord) SetPublishingId(id int64)                      { r.id, r.has = id, true }
func (r *rawRecord) GetPublishingId() int64                        { return r.id }
func (r *rawRecord) HasPublishingId() bool                         { return r.has }
func (r *rawRecord) GetData() [][]byte                             { return nil }
func (r *rawRecord) GetMessageProperties() *amqp.MessageProperties { return nil }
func (r *rawRecord) GetMessageAnnotations() amqp.Annotations       { return nil }
func (r *rawRecord) GetApplicationProperties() map[string]any      { return nil }
func (r *rawRecord) GetMessageHeader() *amqp.MessageHeader         { return nil }
func (r *rawRecord) GetAMQPValue() any                             { return nil }
