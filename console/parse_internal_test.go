package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestACursorComesBackAsTheKeyItWasMadeOf(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 30, 45, 123456000, time.UTC)
	for _, id := range []string{"e-1", "order~7~capture", "<script>", "é"} {
		gotAt, gotID := parseCursor(cursor(at, id))
		require.True(t, gotAt.Equal(at), id)
		require.Equal(t, id, gotID)
	}
	gotAt, gotID := parseCursor("")
	require.True(t, gotAt.IsZero(), "no cursor: the start of the list")
	require.Empty(t, gotID)
	gotAt, _ = parseCursor("yesterday~e-1")
	require.True(t, gotAt.IsZero(), "a cursor that is not one starts the list again")
}

func TestANextPathNeverLeavesTheConsole(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"/ledger": "/ledger", "/deadletters?consumer=b": "/deadletters?consumer=b",
		"//attacker.example/": "/", "/\\attacker.example": "/", "https://attacker.example": "/", "": "/",
		"ledger": "/", "/x\r\nSet-Cookie: a=b": "/"} {
		require.Equal(t, want, safeNext(in), in)
	}
}

func TestAPartitionQueueNamesItsConsumersQueue(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders", baseQueue("orders.p3"))
	require.Equal(t, "orders.priority", baseQueue("orders.priority.p12"))
	require.Equal(t, "orders", baseQueue("orders"))
	require.Equal(t, "orders.px", baseQueue("orders.px"))
	got := candidates(map[string][]string{"shipping": {"parcels.p0", "parcels.p1"}, "billing": {"billing"}})
	require.Equal(t, []leaseCandidate{{"shipping", "parcels"}}, got)
}

func TestCountsSayHowTheyWereObtained(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1,234,567", count{N: 1234567}.String())
	require.Equal(t, "≥ 10,000", count{N: 10000, Kind: atLeast}.String())
	require.Equal(t, "≈ 999", count{N: 999, Kind: estimated}.String())
	require.Equal(t, "-12,345", num(-12345))
}

// FuzzCursor: a cursor from a query string never panics, and one that
// parses is made again as it was read.
func FuzzCursor(f *testing.F) {
	f.Add("2026-03-01T12:30:45.123456Z~e-1")
	f.Add("~")
	f.Add("2026-03-01T12:30:45Z~a~b")
	f.Fuzz(func(t *testing.T, s string) {
		at, id := parseCursor(s)
		if at.IsZero() {
			return
		}
		at2, id2 := parseCursor(cursor(at, id))
		if !at2.Equal(at) || id2 != id {
			t.Fatalf("%q: read as (%v, %q), made again as (%v, %q)", s, at, id, at2, id2)
		}
	})
}

// FuzzSafeNext: whatever next a sign-in form carries, the redirect stays on
// the console's own paths.
func FuzzSafeNext(f *testing.F) {
	f.Add("/ledger")
	f.Add("//evil.example")
	f.Add("/\\evil")
	f.Fuzz(func(t *testing.T, s string) {
		got := safeNext(s)
		if !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") || strings.ContainsAny(got, "\\\r\n") {
			t.Fatalf("safeNext(%q) = %q leaves the console", s, got)
		}
	})
}
