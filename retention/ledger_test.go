package retention_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/retention"
)

// cutoffs returns each table's cutoff from counts.
func cutoffs(counts []retention.Count) map[string]time.Time {
	out := map[string]time.Time{}
	for _, c := range counts {
		out[c.Table] = c.Cutoff
	}
	return out
}

// Settled effects keep their own retention, longer than the inbox's by
// default; tombstones are kept unless told otherwise; Result says what each
// table keeps.
func TestSettledEffectsAndTombstonesKeepTheirOwnRetention(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.inbox("m", 40*day)
	f.effect("settled-40-days-ago", "succeeded", 40*day)
	f.effect("settled-200-days-ago", "succeeded", 200*day)

	// The inbox keeps 30 days, the ledger its default, 180.
	res, err := retention.Clean(t.Context(), retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 30 * day})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted("inbox"))
	require.Equal(t, int64(1), res.Deleted("ledger"), "only the effect settled 200 days ago")
	require.Equal(t, 1, f.count("ledger", "effect_id = 'settled-40-days-ago'"))
	at := cutoffs(res.Counts)
	require.WithinDuration(t, time.Now().Add(-30*day), at["inbox"], time.Minute)
	require.Equal(t, res.Cutoff, at["dead_letters"])
	require.WithinDuration(t, time.Now().Add(-retention.DefaultLedgerOlderThan), at["ledger"], time.Minute)
	require.Equal(t, at["ledger"], at["ledger_audit"])
	require.True(t, at["ledger_tombstones"].IsZero(), "tombstones are kept")
	require.True(t, at["http_keys"].IsZero(), "HTTP keys go at their own expiry")
	require.Equal(t, 1, f.count("ledger_tombstones", "effect_id = 'settled-200-days-ago'"))

	// A longer inbox retention lengthens the ledger's default with it.
	res, err = retention.Clean(t.Context(), retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 365 * day})
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(-365*day), cutoffs(res.Counts)["ledger"], time.Minute)

	// The ledger's own cutoff, shorter, takes the effect settled 40 days ago.
	res, err = retention.Clean(t.Context(), retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 30 * day,
		LedgerOlderThan: 35 * day})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted("ledger"))
	require.WithinDuration(t, time.Now().Add(-35*day), cutoffs(res.Counts)["ledger"], time.Minute)
	require.Zero(t, f.count("ledger", ""))
	require.Equal(t, 2, f.count("ledger_tombstones", ""))

	// Tombstones go only when told, counted from their effect's deletion.
	f.exec("UPDATE " + f.tables.Table("ledger_tombstones") + " SET deleted_at = now() - interval '400 days' WHERE effect_id = 'settled-200-days-ago'")
	res, err = retention.Clean(t.Context(), retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 30 * day,
		TombstonesOlderThan: 365 * day, ChunkSize: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted("ledger_tombstones"))
	require.WithinDuration(t, time.Now().Add(-365*day), cutoffs(res.Counts)["ledger_tombstones"], time.Minute)
	require.Equal(t, 1, f.count("ledger_tombstones", "effect_id = 'settled-40-days-ago'"))
}
