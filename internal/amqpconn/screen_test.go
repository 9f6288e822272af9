package amqpconn

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// entry is a field table entry: key, field type, value.
func entry(key string, typ byte, value []byte) []byte {
	return append(append(shortstr(key), typ), value...)
}

// table is a field table (its length, then its entries).
func table(entries ...[]byte) []byte { return longstr(string(bytes.Join(entries, nil))) }

// array is a field array (its length, then its typed values).
func array(values ...[]byte) []byte { return longstr(string(bytes.Join(values, nil))) }

// nested is a table holding a table … depth levels below it.
func nested(depth int) []byte {
	t := table(entry("leaf", 'S', longstr("x")))
	for range depth {
		t = table(entry("n", 'F', t))
	}
	return t
}

// nestedArrays is a table holding an array holding an array … depth
// levels below the table.
func nestedArrays(depth int) []byte {
	a := array(append([]byte{'S'}, longstr("x")...))
	for range depth - 1 {
		a = array(append([]byte{'A'}, a...))
	}
	return table(entry("a", 'A', a))
}

// wide is a table of n entries, with distinct keys or all one key.
func wide(n int, distinct bool) []byte {
	var es [][]byte
	for i := range n {
		key := "k"
		if distinct {
			key = fmt.Sprint(i)
		}
		es = append(es, entry(key, 'V', nil))
	}
	return table(es...)
}

const (
	flagHeaders   = 0x2000
	flagMessageID = 0x0080
	flagAppID     = 0x0008
)

// withID is a property list of headers, then message id "m-1", then app id
// "app".
func withID(headers []byte) (uint16, []byte) {
	props := append(append(append([]byte(nil), headers...), shortstr("m-1")...), shortstr("app")...)
	return flagHeaders | flagMessageID | flagAppID, props
}

func TestScreenRefusesExactlyWhatTheClientRefuses(t *testing.T) {
	t.Parallel()
	voids := func(n int) []byte { return bytes.Repeat([]byte{'V'}, n) }
	cases := []struct {
		name    string
		headers []byte
		refused string // "" when the client decodes it
	}{
		{"nested 32 deep", nested(32), ""},
		{"nested 33 deep", nested(33), "nested deeper"},
		{"nested 40 deep", nested(40), "nested deeper"},
		{"arrays 32 deep", nestedArrays(32), ""},
		{"arrays 33 deep", nestedArrays(33), "nested deeper"},
		{"8192 distinct keys", wide(8192, true), ""},
		{"8193 distinct keys", wide(8193, true), "more than 8192"},
		{"8193 entries of one key", wide(8193, false), ""},
		{"array of 8192", table(entry("a", 'A', array(voids(8192)))), ""},
		{"array of 8193", table(entry("a", 'A', array(voids(8193)))), "more than 8192"},
		{"field type L", table(entry("u", 'L', make([]byte, 8))), "unknown field type"},
		{"negative byte array length", table(entry("x", 'x', []byte{0x80, 0, 0, 1, 0})), "negative"},
		{"table cut inside an array", table(entry("a", 'A', array([]byte{'F', 0, 0, 0, 1, 5}))), ""}, // the client's EOF quirk
		{"field cut inside an array", table(entry("a", 'A', array([]byte{'I', 0, 0}))), "EOF"},
		{"every field type", table(entry("t", 't', []byte{1}), entry("B", 'B', []byte{2}), entry("b", 'b', []byte{3}),
			entry("s", 's', []byte{0, 4}), entry("u", 'u', []byte{0, 5}), entry("I", 'I', make([]byte, 4)),
			entry("i", 'i', make([]byte, 4)), entry("f", 'f', make([]byte, 4)), entry("l", 'l', make([]byte, 8)),
			entry("d", 'd', make([]byte, 8)), entry("T", 'T', make([]byte, 8)), entry("D", 'D', make([]byte, 5)),
			entry("S", 'S', longstr("s")), entry("x", 'x', longstr("x")), entry("V", 'V', nil)), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			flags, props := withID(tc.headers)
			payload := headerPayload(flags, props)
			got, why := screenHeader(payload, nil)
			d, decoded := clientReads(t, payload)
			if tc.refused == "" {
				require.True(t, decoded, "the client decodes it")
				require.Nil(t, why)
				require.Equal(t, payload, got, "passed on unchanged")
				require.Equal(t, "m-1", d.MessageId)
				return
			}
			require.False(t, decoded, "the client refuses it")
			require.NotNil(t, why)
			require.Equal(t, "headers", why.Property)
			require.Contains(t, why.Error(), tc.refused)
			require.Equal(t, []string{"headers"}, why.Dropped, "only the headers are dropped")
			d, decoded = clientReads(t, got)
			require.True(t, decoded, "the client decodes the screened header")
			require.Equal(t, "m-1", d.MessageId, "the properties after the headers are kept")
			require.Equal(t, "app", d.AppId)
			require.Empty(t, d.Headers)
		})
	}
}

func TestScreenDropsWhatOverrunsTheFrameAndEverythingAfterIt(t *testing.T) {
	t.Parallel()
	lying := binary.BigEndian.AppendUint32(nil, 1000) // a table length past the frame's end
	cases := []struct {
		name    string
		flags   uint16
		props   []byte
		dropped []string
	}{
		{"headers length", flagHeaders | flagMessageID | flagAppID, append(lying, shortstr("m-1")...), []string{"headers", "message-id", "app-id"}},
		{"message id length", flagMessageID | flagAppID, []byte{200, 'm'}, []string{"message-id", "app-id"}},
		{"app id missing", flagMessageID | flagAppID, shortstr("m-1"), []string{"app-id"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			payload := headerPayload(tc.flags, tc.props)
			_, decoded := clientReads(t, payload)
			require.False(t, decoded)
			got, why := screenHeader(payload, nil)
			require.NotNil(t, why)
			require.Equal(t, tc.dropped, why.Dropped)
			_, decoded = clientReads(t, got)
			require.True(t, decoded)
		})
	}
}

// stream is what a broker sends a consumer: a heartbeat, a delivery whose
// content header the client refuses (tag 1), a good one (tag 2) with a
// body, and a basic.return whose content header the client refuses too.
func stream() (in []byte, bad []byte) {
	flags, props := withID(nested(40))
	bad = headerPayload(flags, props)
	good := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, 60<<16), 3) // class, weight, body size
	good = append(binary.BigEndian.AppendUint16(good, flagMessageID), shortstr("m-2")...)
	in = appendFrame(nil, 8, 0, nil)
	in = append(in, deliverFrames("ctag", 1, bad)...)
	in = append(in, deliverFrames("ctag", 2, good)...)
	in = appendFrame(in, 3, 1, []byte("abc"))
	returned := append(append([]byte{1, 56}, shortstr("no route")...), 0, 1, 'q') // 312, text, exchange, routing key
	in = appendMethod(in, 1, 60, 50, returned...)
	in = appendFrame(in, frameHeader, 1, bad)
	return in, bad
}

func TestScreenRewritesOnlyTheRefusedHeaderWhateverTheReadsCut(t *testing.T) {
	t.Parallel()
	in, bad := stream()
	screened, why := screenHeader(bad, nil)
	require.NotNil(t, why)
	want := bytes.Replace(in, appendFrame(nil, frameHeader, 1, bad), appendFrame(nil, frameHeader, 1, screened), -1)
	for _, chunk := range []int{1, 2, 3, 7, 8, 13, 64, len(in)} {
		s := NewScreen()
		f := newFilter(s)
		var out []byte
		for rest := in; len(rest) > 0; {
			n := min(chunk, len(rest))
			out, rest = f.feed(out, rest[:n]), rest[n:]
		}
		require.Equal(t, want, out, "chunks of %d", chunk)
		got, ok := s.Undecodable("ctag", 1)
		require.True(t, ok, "the delivery is noted")
		require.Equal(t, why.Error(), got.Error())
		_, ok = s.Undecodable("ctag", 1)
		require.False(t, ok, "once")
		_, ok = s.Undecodable("ctag", 2)
		require.False(t, ok, "the good delivery is not noted")
		require.Empty(t, s.notes, "the returned message is not a delivery")
	}
}

func TestScreenStepsAsideWhereTheClientCannotFollowTheStream(t *testing.T) {
	t.Parallel()
	flags, props := withID(nested(40))
	bad := appendFrame(nil, frameHeader, 1, headerPayload(flags, props))
	for name, before := range map[string][]byte{
		"protocol header": []byte("AMQP\x00\x00\x09\x01"),
		"too large":       appendFrame(nil, 3, 1, make([]byte, FrameMax)),
	} {
		f := newFilter(NewScreen())
		in := append(append([]byte(nil), before...), bad...)
		require.Equal(t, in, f.feed(nil, in), name)
		require.True(t, f.aside, name)
	}
}

func TestScreenedConnHandsTheClientTheScreenedStream(t *testing.T) {
	t.Parallel()
	in, bad := stream()
	screened, _ := screenHeader(bad, nil)
	want := bytes.Replace(in, appendFrame(nil, frameHeader, 1, bad), appendFrame(nil, frameHeader, 1, screened), -1)
	broker, sock := net.Pipe()
	s := NewScreen()
	c := Screened(sock, s)
	defer c.Close()
	go func() {
		for rest := in; len(rest) > 0; rest = rest[min(5, len(rest)):] {
			_, _ = broker.Write(rest[:min(5, len(rest))])
		}
		_ = broker.Close()
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := io.ReadAll(io.LimitReader(c, int64(len(want))))
	require.NoError(t, err)
	require.Equal(t, want, got)
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the socket's error once everything was read")
	_, ok := s.Undecodable("ctag", 1)
	require.True(t, ok)
}
