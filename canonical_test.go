package idem_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestCanonicalJSONIgnoresKeyOrderAndWhitespace(t *testing.T) {
	t.Parallel()
	a := []byte(`{"amount": 12.50, "currency":"EUR", "meta": {"z": [1, 2, {"b": true, "a": null}], "a": "x"}}`)
	b := []byte("{\n\t\"meta\":{\"a\":\"x\",\"z\":[1,2,{\"a\":null,\"b\":true}]},\r\n \"currency\" : \"EUR\",\"amount\":1.25e1}")

	ca, err := idem.CanonicalJSON(a)
	require.NoError(t, err)
	cb, err := idem.CanonicalJSON(b)
	require.NoError(t, err)
	require.Equal(t, `{"amount":12.5,"currency":"EUR","meta":{"a":"x","z":[1,2,{"a":null,"b":true}]}}`, string(ca))
	require.Equal(t, string(ca), string(cb))

	ha, err := idem.HashJSON(a)
	require.NoError(t, err)
	hb, err := idem.HashJSON(b)
	require.NoError(t, err)
	require.Equal(t, ha, hb)
	require.Equal(t, idem.HashBytes(ca), ha)
}

func TestCanonicalJSONChangedValueChangesHash(t *testing.T) {
	t.Parallel()
	base, err := idem.HashJSON([]byte(`{"id":"o-1","amount":100}`))
	require.NoError(t, err)
	for _, changed := range []string{
		`{"id":"o-1","amount":101}`,
		`{"id":"o-1","amount":"100"}`,
		`{"id":"o-2","amount":100}`,
		`{"id":"o-1 ","amount":100}`,
		`{"id":"o-1","amount":100,"x":null}`,
		`{"id":"o-1","Amount":100}`,
		`[{"id":"o-1","amount":100}]`,
		`{"id":"o-1","amount":12345678901234567890}`,
	} {
		h, err := idem.HashJSON([]byte(changed))
		require.NoError(t, err, changed)
		require.NotEqual(t, base, h, changed)
	}
}

// What CanonicalJSON and HashJSON refuse matches the root's sentinel, the
// name callers outside the module branch on.
func TestRefusedJSONMatchesTheRootSentinel(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, `{"a":1,"a":2}`, "\"\xff\"", `{"amt":1,"AMT":2}`, `1e1234567890`} {
		_, err := idem.CanonicalJSON([]byte(in))
		require.ErrorIs(t, err, idem.ErrInvalidJSON, "%q", in)
		_, err = idem.HashJSON([]byte(in))
		require.ErrorIs(t, err, idem.ErrInvalidJSON, "%q", in)
		require.False(t, errors.Is(err, idem.ErrInvalidID), "%q", in)
	}
}

func ExampleHashJSON() {
	a, _ := idem.HashJSON([]byte(`{"order": "o-1", "amount": 12.50}`))
	b, _ := idem.HashJSON([]byte(`{"amount":1.25e1,"order":"o-1"}`))
	c, _ := idem.CanonicalJSON([]byte(`{"order": "o-1", "amount": 12.50}`))
	fmt.Println(a == b)
	fmt.Println(string(c))
	// Output:
	// true
	// {"amount":12.5,"order":"o-1"}
}
