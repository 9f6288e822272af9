package httpinbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// member is one member of a JSON object the middleware writes.
type member struct {
	key   string
	value any // marshalled with encoding/json; json.RawMessage as is
}

// joinObject writes one JSON object: the members of head, then those of
// app (the inside of an object returned by appMembers), then those of
// tail. The order is fixed, so the same values always give the same bytes.
func joinObject(head []member, app []byte, tail []member) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	write := func(ms []member) error {
		for _, m := range ms {
			v, err := json.Marshal(m.value)
			if err != nil {
				return fmt.Errorf("httpinbox: encode %s: %w", m.key, err)
			}
			if b.Len() > 1 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(m.key) // a string always encodes
			b.Write(k)
			b.WriteByte(':')
			b.Write(v)
		}
		return nil
	}
	if err := write(head); err != nil {
		return nil, err
	}
	if len(app) > 0 {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.Write(app)
	}
	if err := write(tail); err != nil {
		return nil, err
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// appMembers marshals v, which must encode as a JSON object (or null, for
// no members), and returns the inside of the object, between its braces.
// Its members must not be spelled like reserved, in any case: a client that
// decodes case-insensitively could not tell them apart.
func appMembers(v any, reserved ...string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("httpinbox: encode the result: %w", err)
	}
	if string(b) == "null" {
		return nil, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		return nil, fmt.Errorf("httpinbox: the result must encode as a JSON object, got %.40s", b)
	}
	for k := range members {
		for _, r := range reserved {
			if strings.EqualFold(k, r) {
				return nil, fmt.Errorf("httpinbox: the result has a member %q, which the middleware writes itself", k)
			}
		}
	}
	return objectInside(b), nil
}

// objectInside returns what is between the braces of the compact JSON
// object b, or nil when b is not one.
func objectInside(b []byte) []byte {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil
	}
	return bytes.TrimSpace(b[1 : len(b)-1])
}
