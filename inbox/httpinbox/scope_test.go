package httpinbox_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

func TestConfigWithoutScopeIsRefused(t *testing.T) {
	t.Parallel()
	_, err := httpinbox.New(nil, httpinbox.Config{})
	require.ErrorIs(t, err, httpinbox.ErrNoScope)
	require.ErrorIs(t, err, httpinbox.ErrConfig)

	caller := func(r *http.Request) string { return r.Header.Get("X-Test-Caller") }
	for _, cfg := range []httpinbox.Config{
		{SharedScope: true, Caller: caller},
		{SharedScope: true, Tenant: caller},
	} {
		_, err := httpinbox.New(nil, cfg)
		require.ErrorIs(t, err, httpinbox.ErrConfig, "SharedScope contradicts a scope function")
		require.NotErrorIs(t, err, httpinbox.ErrNoScope)
	}
}

func TestCallersWithOneKeyNeverSeeEachOthersResponses(t *testing.T) {
	t.Parallel()
	// The scope function stands for authentication: in a real service it
	// reads the verified principal, here a header the test controls.
	f := newFixture(t, httpinbox.Config{Caller: func(r *http.Request) string { return r.Header.Get("X-Test-Caller") }})
	h := f.handler(httpinbox.Route{})
	body := `{"amount": 5, "currency": "EUR"}`
	alice := post(h, "order-1", body, "X-Test-Caller", "alice")
	require.Equal(t, http.StatusCreated, alice.Code, alice.Body.String())

	// Bob reuses Alice's key with her very request: his handler runs in his
	// own scope, and her stored answer (her payment id) never reaches him.
	bob := post(h, "order-1", body, "X-Test-Caller", "bob")
	require.Equal(t, http.StatusCreated, bob.Code, bob.Body.String())
	require.Empty(t, bob.Header().Get(httpinbox.HeaderReplayed))
	require.NotEqual(t, alice.Header().Get(httpinbox.HeaderResourceID), bob.Header().Get(httpinbox.HeaderResourceID))
	require.NotEqual(t, alice.Body.String(), bob.Body.String())

	// Carol reuses it with another request: no conflict with Alice's record
	// either, because it is not hers to see.
	carol := post(h, "order-1", `{"amount": 7, "currency": "EUR"}`, "X-Test-Caller", "carol")
	require.Equal(t, http.StatusCreated, carol.Code, carol.Body.String())

	again := post(h, "order-1", body, "X-Test-Caller", "alice")
	require.Equal(t, "true", again.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, alice.Body.String(), again.Body.String())
	require.Equal(t, 3, f.count())
	require.Equal(t, 3, f.records())
}

func TestSharedScopeSharesKeysAcrossCallersOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{SharedScope: true})
	h := f.handler(httpinbox.Route{})
	body := `{"amount": 5, "currency": "EUR"}`
	first := post(h, "order-1", body, "X-Test-Caller", "alice")
	require.Equal(t, http.StatusCreated, first.Code)
	other := post(h, "order-1", body, "X-Test-Caller", "bob")
	require.Equal(t, "true", other.Header().Get(httpinbox.HeaderReplayed), "one key space: bob receives alice's answer")
	require.Equal(t, first.Body.String(), other.Body.String())
	require.Equal(t, 1, f.count())
}

// A scope function that finds no principal returns "" for both: two such
// requests with one key would otherwise share its stored response.
func TestAnonymousRequestCannotOwnAKey(t *testing.T) {
	t.Parallel()
	header := func(name string) func(*http.Request) string {
		return func(r *http.Request) string { return r.Header.Get(name) }
	}
	for name, cfg := range map[string]httpinbox.Config{
		"tenant and caller": {Tenant: header("X-Tenant-ID"), Caller: header("X-Test-Caller")},
		"caller only":       {Caller: header("X-Test-Caller")},
		"tenant only":       {Tenant: header("X-Tenant-ID")},
	} {
		f := newFixture(t, cfg)
		h := f.handler(httpinbox.Route{})
		body := `{"amount": 5, "currency": "EUR"}`
		for range 2 {
			requireProblem(t, post(h, "order-1", body), http.StatusUnauthorized, httpinbox.CodeScopeRequired)
		}
		require.Zero(t, f.runs.Load(), name)
		require.Zero(t, f.records(), name)

		// A tenant or a caller alone is a scope.
		require.Equal(t, http.StatusCreated, post(h, "order-1", body, "X-Tenant-ID", "acme", "X-Test-Caller", "alice").Code, name)
	}
}
