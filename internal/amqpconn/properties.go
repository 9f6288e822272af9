package amqpconn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

// The content-header check: a property list read exactly as amqp091-go
// v1.16.0 reads it (read.go: parseHeaderFrame, readTableDepth,
// readArrayDepth, readFieldDepth), quirks included, without building its
// values. Where amqp091-go fails, so does check; where it decodes, check
// passes. FuzzScreenProperties holds the two to that against the client
// itself. Upgrading amqp091-go means reading its read.go again.
//
// The quirks that matter: a field cut short inside an array ends the
// array without an error when the cut falls exactly on a read's first byte
// (the client breaks its loop on a bare io.EOF), and whatever the array's
// length still covered is then read by the container around it; a table
// counts its distinct keys, and refuses any entry once it holds 8,192.

// The client's limits (read.go: maxFieldDepth, maxContainerElements,
// readAllocChunk).
const (
	maxFieldDepth        = 32
	maxContainerElements = 8192
	readAllocChunk       = 64 * 1024
)

// Why the client refuses a property list. io.EOF and io.ErrUnexpectedEOF
// stand for its short reads, as in the client.
var (
	errDepth     = fmt.Errorf("field table or array nested deeper than %d levels", maxFieldDepth)
	errElements  = fmt.Errorf("field table or array of more than %d entries", maxContainerElements)
	errFieldType = errors.New("unknown field type")
	errLength    = errors.New("negative or oversized length")
)

// The property flags of a basic content header, in wire order, as the
// client reads them (types.go: flagContentType … flagReserved1).
var properties = [...]struct {
	flag uint16
	name string
	kind byte // 's' short string, 'F' table, 1 or 8: that many bytes
}{
	{0x8000, "content-type", 's'}, {0x4000, "content-encoding", 's'}, {0x2000, "headers", 'F'},
	{0x1000, "delivery-mode", 1}, {0x0800, "priority", 1}, {0x0400, "correlation-id", 's'},
	{0x0200, "reply-to", 's'}, {0x0100, "expiration", 's'}, {0x0080, "message-id", 's'},
	{0x0040, "timestamp", 8}, {0x0020, "type", 's'}, {0x0010, "user-id", 's'},
	{0x0008, "app-id", 's'}, {0x0004, "cluster-id", 's'},
}

// headerPrefix is a content header's class id, weight, body size and
// property flags.
const headerPrefix = 14

// source is what the client reads a field from: data from *pos, never at
// or past end (its io.LimitedReader over a bytes.Buffer or the frame).
// Readers nested in one another share data and pos, as the client's
// limited readers share the reader beneath them.
type source struct {
	data []byte
	pos  *int
	end  int
}

func (s source) avail() int { return max(min(s.end, len(s.data))-*s.pos, 0) }

// read takes n bytes as io.ReadFull does: io.EOF when none was there,
// io.ErrUnexpectedEOF when some were.
func (s source) read(n int) ([]byte, error) {
	a := s.avail()
	if a >= n {
		b := s.data[*s.pos : *s.pos+n]
		*s.pos += n
		return b, nil
	}
	*s.pos += a
	if a == 0 {
		return nil, io.EOF
	}
	return nil, io.ErrUnexpectedEOF
}

// readBytes takes n bytes as the client's readBytes does: in chunks of
// readAllocChunk, each read with io.ReadFull, so a cut on a chunk's
// boundary is a bare io.EOF.
func (s source) readBytes(n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	a := s.avail()
	if int64(a) >= n {
		return s.read(int(n))
	}
	*s.pos += a
	if a%readAllocChunk == 0 {
		return nil, io.EOF
	}
	return nil, io.ErrUnexpectedEOF
}

func (s source) shortstr() ([]byte, error) {
	n, err := s.read(1)
	if err != nil {
		return nil, err
	}
	return s.readBytes(int64(n[0]))
}

func (s source) longstr() ([]byte, error) {
	n, err := s.read(4)
	if err != nil {
		return nil, err
	}
	length := binary.BigEndian.Uint32(n)
	if length > math.MaxInt32 {
		return nil, errLength
	}
	return s.readBytes(int64(length))
}

// fieldSizes are the sizes of the fixed-size field types.
var fieldSizes = [256]int8{'t': 1, 'B': 1, 'b': 1, 's': 2, 'u': 2, 'I': 4, 'i': 4, 'f': 4, 'l': 8, 'd': 8, 'T': 8}

// field reads one field value at depth (readFieldDepth).
func (s source) field(depth int) error {
	typ, err := s.read(1)
	if err != nil {
		return err
	}
	if n := fieldSizes[typ[0]]; n > 0 {
		_, err = s.read(int(n))
		return err
	}
	switch typ[0] {
	case 'D': // the scale, then the value: two reads
		if _, err = s.read(1); err != nil {
			return err
		}
		_, err = s.read(4)
	case 'S':
		_, err = s.longstr()
	case 'A':
		err = s.array(depth + 1)
	case 'F':
		err = s.table(depth + 1)
	case 'x':
		var n []byte
		if n, err = s.read(4); err != nil {
			return err
		}
		if int32(binary.BigEndian.Uint32(n)) < 0 {
			return errLength
		}
		_, err = s.readBytes(int64(binary.BigEndian.Uint32(n)))
	case 'V':
	default:
		return fmt.Errorf("%w %q", errFieldType, typ[0])
	}
	return err
}

// table reads a field table at depth (readTableDepth).
func (s source) table(depth int) error {
	if depth > maxFieldDepth {
		return errDepth
	}
	content, err := s.longstr()
	if err != nil {
		return err
	}
	pos := 0
	in := source{data: content, pos: &pos, end: len(content)}
	// An entry takes at least 2 bytes (an empty key, 'V'): only a table of
	// that many can reach the limit, and only there are keys counted.
	var keys map[string]struct{}
	if len(content) >= 2*(maxContainerElements+1) {
		keys = map[string]struct{}{}
	}
	for pos < len(content) {
		key, err := in.shortstr()
		if err != nil {
			return err
		}
		if err := in.field(depth); err != nil {
			return err
		}
		if keys != nil {
			if len(keys) >= maxContainerElements {
				return errElements
			}
			keys[string(key)] = struct{}{}
		}
	}
	return nil
}

// array reads a field array at depth (readArrayDepth).
func (s source) array(depth int) error {
	if depth > maxFieldDepth {
		return errDepth
	}
	n, err := s.read(4)
	if err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n)
	if size > math.MaxInt32 {
		return errLength
	}
	in := source{data: s.data, pos: s.pos, end: min(s.end, *s.pos+int(size))}
	for count := 0; ; count++ {
		if err := in.field(depth); err != nil {
			if err == io.EOF { //nolint:errorlint // the client compares with ==
				return nil
			}
			return err
		}
		if count >= maxContainerElements {
			return errElements
		}
	}
}

// property reads one property of the list at s.
func (s source) property(kind byte) error {
	var err error
	switch kind {
	case 's':
		_, err = s.shortstr()
	case 'F':
		err = s.table(0)
	default:
		_, err = s.read(int(kind))
	}
	return err
}

// UndecodableError says why the client library would have refused a
// delivery's properties, and which the screen dropped so that it could
// read the rest.
type UndecodableError struct {
	// Property is the first property the client could not read.
	Property string
	// Err is why.
	Err error
	// Dropped names the properties left out of what the client was given.
	Dropped []string
}

func (e *UndecodableError) Error() string {
	return fmt.Sprintf("amqp091-go cannot decode the message's %s property: %v (the client was given the message without: %s)",
		e.Property, e.Err, strings.Join(e.Dropped, ", "))
}

func (e *UndecodableError) Unwrap() error { return e.Err }

// screenHeader checks a content header's payload and returns it unchanged
// with a nil error when the client would decode it. Otherwise it returns
// a payload the client decodes (written over scratch) and why: the
// properties the client would refuse are left out — a header table whose
// length lies within the frame alone, anything that overruns the frame
// with all the properties after it. A payload too short for its fixed
// part is returned unchanged with a nil error: that is not a publisher's
// doing (the broker writes it), and the client's own error stands.
func screenHeader(payload, scratch []byte) ([]byte, *UndecodableError) {
	if len(payload) < headerPrefix {
		return payload, nil
	}
	flags := binary.BigEndian.Uint16(payload[12:14])
	pos := headerPrefix
	s := source{data: payload, pos: &pos, end: len(payload)}
	var bad *UndecodableError
	out := scratch[:0]
	for i, p := range properties {
		if flags&p.flag == 0 {
			continue
		}
		start := pos
		err := s.property(p.kind)
		if err == nil {
			if bad != nil {
				out = append(out, payload[start:pos]...)
			}
			continue
		}
		if bad == nil {
			bad = &UndecodableError{Property: p.name, Err: err}
			out = append(append(out, payload[:headerPrefix]...), payload[headerPrefix:start]...)
		}
		bad.Dropped = append(bad.Dropped, p.name)
		flags &^= p.flag
		if next, ok := skipTable(payload, start, p.kind); ok {
			pos = next // the rest can still be read
			continue
		}
		for _, q := range properties[i+1:] { // nothing after it can be found
			if flags&q.flag != 0 {
				bad.Dropped = append(bad.Dropped, q.name)
				flags &^= q.flag
			}
		}
		break
	}
	if bad == nil {
		return payload, nil
	}
	binary.BigEndian.PutUint16(out[12:14], flags)
	return out, bad
}

// skipTable returns where a table property that starts at start ends,
// when its length lies within the payload.
func skipTable(payload []byte, start int, kind byte) (int, bool) {
	if kind != 'F' || len(payload)-start < 4 {
		return 0, false
	}
	end := int64(start) + 4 + int64(binary.BigEndian.Uint32(payload[start:]))
	if end > int64(len(payload)) {
		return 0, false
	}
	return int(end), true
}
