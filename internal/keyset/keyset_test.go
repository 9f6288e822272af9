package keyset_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/keyset"
)

func TestACursorGivesBackItsTimeAndID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 30, 0, 123456000, time.UTC)
	for _, id := range []string{"", "e-1", "a:b:c", "ünïcode \x00 and more"} {
		ts, got, err := keyset.Decode(keyset.Encode(at, id))
		require.NoError(t, err)
		require.Equal(t, id, got)
		require.True(t, at.Equal(ts), "%s != %s", at, ts)
	}
}

func TestAForeignCursorIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"", "!!", "bm9jb2xvbg", "KzE6YQ", "LTk5OTk5OTk5OTk5OTk5OTk5OmE"} { // "", not base64, "nocolon", "+1:a", year < 1
		_, _, err := keyset.Decode(c)
		require.ErrorIs(t, err, keyset.ErrCursor, "%q", c)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(keyset.Encode(time.Unix(1, 0), "e-1"))
	f.Add("")
	f.Add("MTIzOg")
	f.Fuzz(func(t *testing.T, c string) {
		ts, id, err := keyset.Decode(c)
		if err != nil {
			return
		}
		// What decodes encodes back to a cursor naming the same row.
		ts2, id2, err := keyset.Decode(keyset.Encode(ts, id))
		if err != nil || id2 != id || !ts2.Equal(ts) {
			t.Fatalf("%q: %v %q -> %v %q %v", c, ts, id, ts2, id2, err)
		}
	})
}

func TestWalkVisitsEveryRowOnceAndStopsAtAShortPage(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 6, 7} {
		rows := make([]int, n)
		for i := range rows {
			rows[i] = i
		}
		calls := 0
		var seen []int
		err := keyset.Walk(3, func(after string) ([]int, error) {
			calls++
			from := 0
			if after != "" {
				_, id, err := keyset.Decode(after)
				require.NoError(t, err)
				fmt.Sscan(id, &from)
				from++
			}
			return rows[from:min(from+3, n)], nil
		}, func(i int) string { return keyset.Encode(time.Unix(0, 0), fmt.Sprint(i)) }, func(i int) error {
			seen = append(seen, i)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, rows, append([]int{}, seen...), "n=%d", n)
		require.Equal(t, n/3+1, calls, "n=%d: one short page ends the walk", n)
	}
	boom := errors.New("boom")
	err := keyset.Walk(3, func(string) ([]int, error) { return []int{1, 2, 3}, nil },
		func(int) string { return "c" }, func(int) error { return boom })
	require.ErrorIs(t, err, boom)
}

func TestWhereHoldsOnlyTheFiltersThatAreSet(t *testing.T) {
	var w keyset.Where
	w.Equal("status", "")
	w.Equal("consumer", "c1")
	if err := w.After(keyset.Encode(time.Unix(10, 0), "e-1"), "created_at", "effect_id", "text",
		func(s string) (any, error) { return s, nil }); err != nil {
		t.Fatal(err)
	}
	want := " WHERE consumer = $1 AND (created_at, effect_id) > ($2::timestamptz, $3::text)"
	if got := w.SQL(); got != want {
		t.Fatalf("SQL() = %q, want %q", got, want)
	}
	if len(w.Args) != 3 || w.Args[0] != "c1" || w.Args[2] != "e-1" {
		t.Fatalf("Args = %v", w.Args)
	}
	var empty keyset.Where
	if empty.SQL() != "" {
		t.Fatalf("no filter gave %q", empty.SQL())
	}
	if err := empty.After("not a cursor!", "a", "b", "text", nil); !errors.Is(err, keyset.ErrCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}
