package amqpconn

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzScreenProperties holds the screen to the client on arbitrary property
// lists: what amqp091-go decodes passes unchanged and unnoted; what it
// refuses is rewritten into a header it decodes, which the screen then
// passes unchanged.
func FuzzScreenProperties(f *testing.F) {
	for _, h := range [][]byte{nested(33), wide(3, true), table(entry("u", 'L', make([]byte, 8))),
		table(entry("a", 'A', array([]byte{'F', 0, 0, 0, 1, 5})))} {
		flags, props := withID(h)
		f.Add(flags, props)
	}
	f.Add(uint16(0xFFFF), []byte("\x00\x00\x00\x00\x00\x01\x02"))
	f.Fuzz(func(t *testing.T, flags uint16, props []byte) {
		payload := headerPayload(flags, props)
		got, why := screenHeader(payload, nil)
		if _, decoded := clientReads(t, payload); decoded {
			require.Nil(t, why, "the client decodes it")
			require.Equal(t, payload, got)
			return
		}
		require.NotNil(t, why, "the client refuses it")
		_, decoded := clientReads(t, got)
		require.True(t, decoded, "the client decodes the screened header")
		again, why := screenHeader(got, nil)
		require.Nil(t, why)
		require.Equal(t, got, again)
	})
}

// FuzzScreenStream feeds arbitrary streams to the filter in pieces of
// arbitrary size: it never panics, never reads the stream out of step with
// the client (its output is that of a reference that splits the whole
// stream at once), notes the same deliveries however the reads cut the
// stream, and what it passes on it would pass on unchanged.
func FuzzScreenStream(f *testing.F) {
	in, _ := stream()
	f.Add(in, uint8(3))
	f.Add(append([]byte("AMQP\x00\x00\x09\x01"), in...), uint8(0))
	f.Add(appendFrame(nil, 3, 1, make([]byte, 40)), uint8(9))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		whole := newFilter(NewScreen())
		out := whole.feed(nil, in)
		require.Equal(t, referenceScreen(in), out)
		cut := newFilter(NewScreen())
		var pieces []byte
		for rest := in; len(rest) > 0; {
			n := min(int(chunk)+1, len(rest))
			pieces, rest = cut.feed(pieces, rest[:n]), rest[n:]
		}
		require.Equal(t, out, pieces)
		require.Equal(t, len(whole.screen.notes), len(cut.screen.notes))
		for k, why := range whole.screen.notes {
			require.Equal(t, why.Error(), cut.screen.notes[k].Error())
		}
		again := newFilter(NewScreen()).feed(nil, out)
		require.Equal(t, out, again)
	})
}

// referenceScreen is what the filter must pass on of the whole stream in:
// its frames in order, content headers screened, up to a frame the client
// cannot follow (passed on from there unchanged), an unfinished body or
// heartbeat frame as far as it came, an unfinished method or content
// header not at all.
func referenceScreen(in []byte) []byte {
	var out []byte
	for len(in) >= frameHeaderLen {
		typ, size := in[0], int64(binary.BigEndian.Uint32(in[3:7]))
		if (typ != frameMethod && typ != frameHeader && typ != frameBody && typ != frameHeartbeat) || size+frameHeaderLen+1 > FrameMax {
			return append(out, in...)
		}
		end := frameHeaderLen + int(size) + 1
		if end > len(in) {
			if typ == frameMethod || typ == frameHeader {
				return out
			}
			return append(out, in...)
		}
		frame := in[:end]
		in = in[end:]
		if typ != frameHeader || frame[end-1] != frameEnd {
			out = append(out, frame...)
			continue
		}
		screened, why := screenHeader(frame[frameHeaderLen:end-1], nil)
		if why == nil {
			out = append(out, frame...)
			continue
		}
		out = appendFrame(out, frameHeader, binary.BigEndian.Uint16(frame[1:3]), screened)
	}
	return out
}

// BenchmarkScreen measures the filter on deliveries of 1 KiB bodies with a
// few properties: the cost the screen adds to every delivery.
func BenchmarkScreen(b *testing.B) {
	header := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, 60<<16), 1024)
	flags, props := withID(table(entry("tenant", 'S', longstr("acme")), entry("attempt", 'l', make([]byte, 8))))
	header = append(binary.BigEndian.AppendUint16(header, flags), props...)
	var in []byte
	for tag := range uint64(64) {
		in = append(in, deliverFrames("ctag", tag+1, header)...)
		in = appendFrame(in, 3, 1, make([]byte, 1024))
	}
	f := newFilter(NewScreen())
	out := make([]byte, 0, len(in))
	b.SetBytes(int64(len(in)))
	b.ResetTimer()
	for range b.N {
		out = f.feed(out[:0], in)
	}
}
