package inbox

import (
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// A pointerArray goes on the wire exactly as the plain slice would.
func TestPointerArrayEncodesLikeTheSlice(t *testing.T) {
	m := pgtype.NewMap()
	for _, tc := range []struct {
		oid          uint32
		plain, array any
	}{
		{pgtype.TextArrayOID, []string{"a", "", "ü\x01"}, pointerArray[textElem]{"a", "", "ü\x01"}},
		{pgtype.TextArrayOID, []string{}, pointerArray[textElem]{}},
		{pgtype.ByteaArrayOID, [][]byte{{1, 2}, {}, {0xff}}, pointerArray[byteaElem]{{1, 2}, {}, {0xff}}},
	} {
		for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
			want, err := m.Encode(tc.oid, format, tc.plain, nil)
			require.NoError(t, err)
			got, err := m.Encode(tc.oid, format, tc.array, nil)
			require.NoError(t, err)
			require.Equal(t, want, got, "%T in format %d", tc.plain, format)
		}
	}
	got, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, pointerArray[textElem](nil), nil)
	require.NoError(t, err)
	require.Nil(t, got, "a nil array is NULL")
}

// Encoding a pointerArray allocates nothing per element.
func TestPointerArrayEncodesWithoutAnAllocationPerElement(t *testing.T) {
	m := pgtype.NewMap()
	ids := make(pointerArray[textElem], 1000)
	for i := range ids {
		ids[i] = "message-id-long-enough-not-to-be-interned"
	}
	buf := make([]byte, 0, 64<<10)
	_, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, ids, buf)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(10, func() {
		_, _ = m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, ids, buf[:0])
	})
	require.Less(t, allocs, 100.0, "allocations for 1000 elements")
}
