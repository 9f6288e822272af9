package stream

// This test is idem's, for its patch (see ../doc.go).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/idemkit/idem/internal/streamclient/amqp"
)

// mapKeyed is an AMQP 1.0 message whose message annotations have a map as
// a key, with a message-id and a data section: the upstream decoder
// panics on it (hash of unhashable type).
var mapKeyed = []byte{
	0x00, 0x53, 0x72, 0xc1, 0x07, 0x02, // message-annotations: map8 of 2 items
	0xc1, 0x01, 0x00, // key: an empty map8
	0xa1, 0x01, 'x', // value: str8 "x"
	0x00, 0x53, 0x73, 0xc0, 0x06, 0x01, 0xa1, 0x03, 'm', '-', '1', // properties: message-id "m-1"
	0x00, 0x53, 0x75, 0xa0, 0x04, 'b', 'o', 'd', 'y', // data: "body"
}

// arrayBomb is an AMQP 1.0 message whose application property "a" is an
// array of 2^32-1 elements that take no byte each (true): upstream
// allocates 4 GiB for it.
var arrayBomb = []byte{
	0x00, 0x53, 0x74, 0xc1, 0x0e, 0x02, 0xa1, 0x01, 'a', // application-properties: map8 of 2 items, key "a"
	0xf0, 0x00, 0x00, 0x00, 0x05, 0xff, 0xff, 0xff, 0xff, 0x41, // array32 of 2^32-1 true
}

// good is an AMQP 1.0 message with a message-id and a data section.
var good = []byte{
	0x00, 0x53, 0x73, 0xc0, 0x06, 0x01, 0xa1, 0x03, 'g', '-', '1',
	0x00, 0x53, 0x75, 0xa0, 0x02, 'o', 'k',
}

func TestUpstreamDecoderPanicsOnAMapAsAnnotationKey(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { _ = (&amqp.Message{}).UnmarshalBinary(mapKeyed) },
		"the decoder no longer panics: the patch may be dropped")
}

func TestDecodeTurnsAPanicOrAnErrorIntoADecodeError(t *testing.T) {
	t.Parallel()
	m := amqp.Decode(mapKeyed)
	require.NotNil(t, m.DecodeError)
	require.Contains(t, m.DecodeError.Error(), "panicked")
	require.Equal(t, mapKeyed, m.DecodeError.Record)
	require.Nil(t, m.Properties)

	m = amqp.Decode([]byte("not an AMQP 1.0 message"))
	require.NotNil(t, m.DecodeError)
	require.Equal(t, []byte("not an AMQP 1.0 message"), m.DecodeError.Record)

	m = amqp.Decode(arrayBomb)
	require.ErrorContains(t, m.DecodeError, "arrays of 4294967295 elements")

	m = amqp.Decode(good)
	require.Nil(t, m.DecodeError)
	require.Equal(t, "g-1", m.Properties.MessageID)
	require.Equal(t, [][]byte{[]byte("ok")}, m.Data)
}

// records frames each of recs as a chunk holds a simple entry: its size,
// then its bytes.
func records(recs ...[]byte) *bufio.Reader {
	var b bytes.Buffer
	for _, r := range recs {
		_ = binary.Write(&b, binary.BigEndian, uint32(len(r)))
		b.Write(r)
	}
	return bufio.NewReader(&b)
}

// Every record of a chunk reaches the consumer at its offset: the ones the
// client cannot decode with their DecodeError, the others decoded; a
// record whose stated size overruns the chunk is cut short, not read
// beyond it.
func TestDecodeMessageDeliversWhatItCannotDecodeWithItsError(t *testing.T) {
	t.Parallel()
	r := records(good, mapKeyed, []byte("garbage"), good)
	var out offsetMessages
	for off := range int64(4) {
		out = (&Client{}).decodeMessage(r, false, off, -1, out)
	}
	require.Len(t, out, 4)
	for i, want := range []bool{false, true, true, false} {
		require.Equal(t, int64(i), out[i].offset)
		require.Equal(t, want, out[i].message.DecodeError != nil, "offset %d", i)
	}
	require.Equal(t, "g-1", out[3].message.Properties.MessageID)

	big, err := amqp.NewMessage(bytes.Repeat([]byte("b"), 300<<10)).MarshalBinary()
	require.NoError(t, err)
	out = (&Client{}).decodeMessage(records(big, good), false, 0, -1, nil)
	require.Nil(t, out[0].message.DecodeError)
	require.Len(t, out[0].message.Data[0], 300<<10)

	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, uint32(1<<31))
	b.WriteString("short")
	out = (&Client{}).decodeMessage(bufio.NewReader(&b), false, 0, -1, nil)
	require.Len(t, out, 1)
	require.ErrorContains(t, out[0].message.DecodeError, "cut short")
	require.Equal(t, []byte("short"), out[0].message.DecodeError.Record)
}

// Whatever bytes a publisher appends, the client hands over one message
// per record, at its offset, never panicking: decoded, or holding a
// DecodeError with the record's bytes; and the record after it is read
// as it was written.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(good)
	f.Add(mapKeyed)
	f.Add([]byte("garbage"))
	f.Add(arrayBomb)
	f.Add([]byte{0x00, 0x53, 0x72, 0xc1, 0x03, 0x02, 0x45, 0x45}) // a list0 as a key
	f.Add([]byte{0x00, 0x53, 0x74, 0xc1, 0x03, 0x02, 0xc1, 0x01}) // application-properties cut short
	f.Fuzz(func(t *testing.T, rec []byte) {
		r := records(rec, good)
		out := (&Client{}).decodeMessage(r, false, 10, -1, nil)
		out = (&Client{}).decodeMessage(r, false, 11, -1, out)
		require.Len(t, out, 2)
		require.Equal(t, int64(10), out[0].offset)
		if e := out[0].message.DecodeError; e != nil {
			require.Equal(t, rec, e.Record)
			require.Error(t, e.Err)
		}
		require.Nil(t, out[1].message.DecodeError)
		require.Equal(t, "g-1", out[1].message.Properties.MessageID)
	})
}

// deliver is a deliver frame (after its command and version) for
// subscription id: a chunk at offset of numRecords records in entries.
func deliver(id uint8, offset int64, numRecords uint32, entries ...[]byte) *bufio.Reader {
	data := bytes.Join(entries, nil)
	var b bytes.Buffer
	b.Write([]byte{id, 1, 0}) // subscription, magic and version, chunk type
	_ = binary.Write(&b, binary.BigEndian, uint16(len(entries)))
	_ = binary.Write(&b, binary.BigEndian, numRecords)
	_ = binary.Write(&b, binary.BigEndian, [3]int64{0, 0, offset}) // timestamp, epoch, offset
	_ = binary.Write(&b, binary.BigEndian, [4]uint32{crc32.ChecksumIEEE(data), uint32(len(data)), 0, 0})
	b.Write(data)
	return bufio.NewReader(&b)
}

// badSubEntry is a sub-entry batch of n records, compressed with compression,
// whose data is data.
func badSubEntry(compression byte, n uint16, uncompressed uint32, data []byte) []byte {
	var b bytes.Buffer
	b.WriteByte(0x80 | compression<<4)
	_ = binary.Write(&b, binary.BigEndian, n)
	_ = binary.Write(&b, binary.BigEndian, [2]uint32{uncompressed, uint32(len(data))})
	b.Write(data)
	return b.Bytes()
}

func simpleEntry(rec []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(len(rec)))
}

// A sub-entry batch that cannot be uncompressed delivers each of its
// records with a DecodeError (the client read them from a nil reader and
// panicked); an uncompressed one whose record sizes overrun it delivers
// its records so, and the entries after it are read as written.
func TestHandleDeliverDeliversTheRecordsOfABadSubEntryBatchWithTheirError(t *testing.T) {
	t.Parallel()
	c := newClient(connectionParameters{})
	var err error
	c.metrics, err = newStreamMetrics(noop.NewMeterProvider())
	require.NoError(t, err)
	consumer, err := c.coordinator.NewConsumer(nil, NewConsumerOptions(), nil)
	require.NoError(t, err)
	overrun := append(binary.BigEndian.AppendUint32(nil, 1000), good...)
	c.handleDeliver(deliver(consumer.ID, 100, 6,
		append(simpleEntry(good), good...),
		badSubEntry(GZIP, 2, 50, []byte("not gzip")),
		badSubEntry(0, 2, uint32(len(overrun)), overrun),
		append(simpleEntry(good), good...)))
	chunk := <-consumer.chunkForConsumer
	require.Len(t, chunk.offsetMessages, 6)
	for i, want := range []bool{false, true, true, true, true, false} {
		m := chunk.offsetMessages[i]
		require.Equal(t, int64(100+i), m.offset)
		require.Equal(t, want, m.message.DecodeError != nil, "offset %d", m.offset)
	}
	require.ErrorContains(t, chunk.offsetMessages[1].message.DecodeError, "sub-entry batch")
	require.ErrorContains(t, chunk.offsetMessages[3].message.DecodeError, "cut short")
	require.Equal(t, "g-1", chunk.offsetMessages[5].message.Properties.MessageID)
}
