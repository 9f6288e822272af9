package httpinbox_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// Item keys belong to the scope of the request that carries them, as
// operation keys do: two tenants, or two callers of one tenant, who pick the
// same item keys each get their items run, never see each other's results
// and never conflict with each other's items. Only the same scope, under
// another operation key, gets already_accepted.
func TestBulkItemKeysAreSeparatedByTenantAndCaller(t *testing.T) {
	t.Parallel()
	for name, scopes := range map[string][2][]string{
		"callers": {{"X-Test-Caller", "alice"}, {"X-Test-Caller", "bob"}},
		"tenants": {{"X-Tenant-ID", "acme", "X-Test-Caller", "ops"}, {"X-Tenant-ID", "globex", "X-Test-Caller", "ops"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
			one, two := scopes[0], scopes[1]

			// The same item keys, each scope under its own operation key: x is
			// the very same item in both, y a different item with the same key.
			first := post(f.h, "op-one-1", items("x=10", "y=20"), one...)
			require.Equal(t, http.StatusOK, first.Code, first.Body.String())
			require.Equal(t, "x:accepted y:accepted", statuses(results(t, first)))
			second := post(f.h, "op-two-1", items("x=10", "y=25"), two...)
			require.Equal(t, http.StatusOK, second.Code, second.Body.String())
			require.Equal(t, "x:accepted y:accepted", statuses(results(t, second)),
				"another scope's x is not already accepted, nor its y a reused key")
			r1, r2 := results(t, first), results(t, second)
			require.NotEqual(t, r1[0].PaymentID, r2[0].PaymentID, "each scope gets its own payment, never the other's result")
			require.EqualValues(t, 2, f.runsOf("x"))
			require.EqualValues(t, 2, f.runsOf("y"))
			require.Equal(t, 4, f.count())

			// The same scope reusing its item keys under another operation:
			// x already accepted with its own original result, y with its own
			// item a reused key; z is new.
			again := post(f.h, "op-one-2", items("x=10", "y=25", "z=30"), one...)
			require.Equal(t, http.StatusMultiStatus, again.Code, again.Body.String())
			ra := results(t, again)
			require.Equal(t, "x:already_accepted y:rejected z:accepted", statuses(ra))
			require.Equal(t, r1[0].PaymentID, ra[0].PaymentID, "scope one's own x")
			require.Contains(t, string(ra[1].Problem), httpinbox.CodeKeyReused, "y=25 is scope two's item, not scope one's")
			againTwo := post(f.h, "op-two-2", items("y=25"), two...)
			require.Equal(t, http.StatusOK, againTwo.Code, againTwo.Body.String())
			rt := results(t, againTwo)
			require.Equal(t, "y:already_accepted", statuses(rt))
			require.Equal(t, r2[1].PaymentID, rt[0].PaymentID, "scope two's own y")
			require.EqualValues(t, 2, f.runsOf("x"), "no item ran twice in its scope")
			require.EqualValues(t, 2, f.runsOf("y"))
			require.Equal(t, 5, f.count())

			// One item record per scope and key, and one payment identity per
			// item record: the item's KeyID differs between scopes.
			var records, distinct int
			require.NoError(t, f.pool.QueryRow(context.Background(),
				`SELECT count(*), count(DISTINCT (tenant, caller)) FROM `+f.tables.Table("http_keys")+
					` WHERE operation = 'payments.bulk.item' AND idempotency_key IN ('x', 'y')`).Scan(&records, &distinct))
			require.Equal(t, 4, records)
			require.Equal(t, 2, distinct)
			require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(DISTINCT key_id) FROM `+f.payments).Scan(&distinct))
			require.Equal(t, 5, distinct)
		})
	}
}
