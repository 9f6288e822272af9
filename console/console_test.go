package console_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/ledger"
)

// screens are the console's pages, for tests that visit every one.
func screens(deadLetter int64, effect string) []string {
	return []string{"/", "/deadletters", "/deadletters?consumer=billing&reason=max_attempts", "/deadletters?id=m-1",
		"/deadletters/" + strconv.FormatInt(deadLetter, 10), "/ledger", "/ledger?show=unknown", "/ledger?show=failed_terminal",
		"/ledger?show=due", "/ledger/effect?id=" + url.QueryEscape(effect), "/http", "/replays", "/partitions"}
}

func TestEveryScreenAnswersWithAStrictContentSecurityPolicyAndNoScript(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dl := f.deadLetter("billing", "m-1", "max_attempts", nil)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c := f.serve(console.Config{})
	handler := regexp.MustCompile(`(?i)<[^>]+\son[a-z]+\s*=`)
	for _, path := range screens(dl, eff) {
		req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
		require.NoError(t, err)
		code, body, h := c.do(req)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		csp := h.Get("Content-Security-Policy")
		require.Contains(t, csp, "default-src 'none'", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.NotContains(t, csp, "script-src", path, "no script is allowed at all")
		require.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		require.NotContains(t, strings.ToLower(body), "<script", path)
		require.False(t, handler.MatchString(body), "%s has an inline event handler", path)
	}
}

func TestAMessageIDWithMarkupOrATerminalEscapeRendersAsText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const xss = `<img src=x onerror=alert(1)>`
	dl := f.deadLetter("billing", xss, "max_attempts", nil)
	f.deadLetter("billing\x1b[2J", "m-\u202eevil", "max_attempts", nil)
	c := f.serve(console.Config{})
	for _, path := range []string{"/deadletters", "/deadletters/" + strconv.FormatInt(dl, 10), "/deadletters?id=" + url.QueryEscape(xss), "/"} {
		code, body := c.get(path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<img", path)
		require.NotContains(t, body, "<b>bold", path, "the error is text too")
		require.NotContains(t, body, "\x1b", path)
		require.NotContains(t, body, "\u202e", path)
		if path != "/" {
			require.Contains(t, body, "&lt;img src=x onerror=alert(1)&gt;", path)
		}
	}
	_, body := c.get("/deadletters")
	require.Contains(t, body, `billing\x1b[2J`)
	require.Contains(t, body, `m-\u202eevil`)
	require.Contains(t, body, `boom \x1b[31mred\x1b[0m &lt;b&gt;bold&lt;/b&gt;`)
}

func TestWithoutAuthenticationOnlyLoopbackRequestsAreServed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c, err := console.New(console.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	serve := func(local, remote, host string, header http.Header) int {
		req := httptest.NewRequest(http.MethodGet, "http://"+host+"/", nil)
		req.RemoteAddr, req.Host = remote, host
		for k, v := range header {
			req.Header[k] = v
		}
		addr, err := net.ResolveTCPAddr("tcp", local)
		require.NoError(t, err)
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, addr))
		w := httptest.NewRecorder()
		c.ServeHTTP(w, req)
		return w.Code
	}
	require.Equal(t, http.StatusOK, serve("127.0.0.1:8080", "127.0.0.1:5000", "127.0.0.1:8080", nil))
	require.Equal(t, http.StatusOK, serve("[::1]:8080", "[::1]:5000", "localhost:8080", nil))
	require.Equal(t, http.StatusForbidden, serve("10.0.0.5:8080", "127.0.0.1:5000", "127.0.0.1:8080", nil), "listening beyond loopback")
	require.Equal(t, http.StatusForbidden, serve("127.0.0.1:8080", "10.0.0.9:5000", "127.0.0.1:8080", nil), "a remote peer")
	require.Equal(t, http.StatusForbidden, serve("127.0.0.1:8080", "127.0.0.1:5000", "attacker.example:8080", nil),
		"a page of another site whose name resolves to loopback (DNS rebinding)")
	require.Equal(t, http.StatusForbidden, serve("127.0.0.1:8080", "127.0.0.1:5000", "127.0.0.1:8080",
		http.Header{"X-Forwarded-For": {"203.0.113.7"}}), "a proxy in front")
}

func TestLoopbackAddrTellsLoopbackFromEveryInterface(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:0": true, "localhost:8080": true, "127.0.0.2:1": true,
		"0.0.0.0:8080": false, ":8080": false, "[::]:8080": false, "10.1.2.3:80": false, "example.com:80": false, "garbage": false} {
		require.Equal(t, want, console.LoopbackAddr(addr), addr)
	}
}

func TestAPostWithoutItsFormTokenOrFromAnotherSiteChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c := f.serve(console.Config{})
	form := url.Values{"id": {eff}, "as": {"succeeded"}, "reason": {"checked with the gateway"}}
	code, _ := c.post("/ledger/resolve", form)
	require.Equal(t, http.StatusForbidden, code, "no token: the client read no page yet")
	c.get("/ledger")
	form.Set("csrf", "bm90LXRoZS10b2tlbg")
	code, _ = c.post("/ledger/resolve", form)
	require.Equal(t, http.StatusForbidden, code, "a token of another session")
	form.Del("csrf")
	c.header = http.Header{"Sec-Fetch-Site": {"cross-site"}, "Origin": {"https://attacker.example"}}
	code, _ = c.post("/ledger/resolve", form)
	require.Equal(t, http.StatusForbidden, code, "a form posted from another site")
	require.Equal(t, "unknown", f.status(eff))
	require.Empty(t, f.audit(eff))

	c.header = nil
	code, body := c.post("/ledger/resolve", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "succeeded", f.status(eff))
}

func TestReadOnlyHasNoFormsAndRefusesEveryPost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dl := f.deadLetter("billing", "m-1", "max_attempts", nil)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c := f.serve(console.Config{ReadOnly: true})
	for _, path := range screens(dl, eff) {
		code, body := c.get(path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, strings.ToLower(body), `method="post"`, path)
		require.NotContains(t, body, `name="csrf"`, path)
	}
	// A script with a bearer token needs no form token: only read-only
	// stands between its POST and the action.
	script := f.serve(console.Config{ReadOnly: true, Tokens: map[string]string{"deploy-bot": "another-token-0123456789"}})
	script.header = http.Header{"Authorization": {"Bearer another-token-0123456789"}}
	for _, path := range []string{"/ledger/resolve", "/deadletters/discard", "/deadletters/redrive", "/http/key/resolve", "/replays/abandon"} {
		code, body := script.post(path, url.Values{"id": {eff, strconv.FormatInt(dl, 10)}, "as": {"succeeded"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "the console is read-only: it takes no action", path)
	}
	require.Equal(t, "unknown", f.status(eff))
	require.Empty(t, f.redrivenBy(dl))
}

func TestPayloadsAndStoredRequestsStayHiddenUnlessTheConsoleShowsThem(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dl := f.deadLetter("billing", "m-1", "max_attempts", []byte(`{"card":"4242-secret-payload"}`))
	eff := f.effect("o-1", ledger.StatusUnknown)
	detail, effect := "/deadletters/"+strconv.FormatInt(dl, 10), "/ledger/effect?id="+url.QueryEscape(eff)
	hidden := f.serve(console.Config{})
	for _, path := range []string{detail, detail + "?payload=1", effect, effect + "&payload=1", "/deadletters"} {
		_, body := hidden.get(path)
		require.NotContains(t, body, "secret-payload", path)
		require.NotContains(t, body, "secret-address", path)
	}
	shown := f.serve(console.Config{ShowPayloads: true})
	_, body := shown.get(detail)
	require.NotContains(t, body, "secret-payload", "hidden until asked")
	require.Contains(t, body, "Show the payload")
	_, body = shown.get(detail + "?payload=1")
	require.Contains(t, body, "4242-secret-payload")
	_, body = shown.get(effect + "&payload=1")
	require.Contains(t, body, "secret-address@example.com")
}

func TestAResolutionIsAuditedAsWhoAuthenticatedNotAsAFormSays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c := f.serve(console.Config{BasicAuth: map[string]string{"alice": "correct horse"}})
	code, _ := c.get("/ledger")
	require.Equal(t, http.StatusUnauthorized, code)
	c.user, c.pass = "alice", "wrong"
	code, _ = c.get("/ledger")
	require.Equal(t, http.StatusUnauthorized, code)
	c.pass = "correct horse"
	code, body := c.get("/ledger/effect?id=" + url.QueryEscape(eff))
	require.Equal(t, http.StatusOK, code, body)
	code, body = c.post("/ledger/resolve", url.Values{"id": {eff}, "as": {"failed"}, "reason": {"INC-7: the gateway has no such charge"},
		"operator": {"mallory"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "failed_terminal", f.status(eff))
	require.Equal(t, []string{"alice: unknown -> failed_terminal: INC-7: the gateway has no such charge"}, f.audit(eff))
	code, _ = c.post("/ledger/resolve", url.Values{"id": {eff}, "as": {"failed"}})
	require.Equal(t, http.StatusBadRequest, code, "a reason is required")
}

func TestATokenSignsInOnceAndNamesTheOperator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c := f.serve(console.Config{Tokens: map[string]string{"oncall-bob": "s3cret-token-0123456789"}})
	req, err := http.NewRequest(http.MethodGet, c.base+"/ledger", nil)
	require.NoError(t, err)
	code, _, h := c.do(req)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/login?next=%2Fledger", h.Get("Location"))
	c.get("/login")
	code, _ = c.post("/login", url.Values{"token": {"guess-guess-guess-guess"}, "next": {"/ledger"}})
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = c.post("/login", url.Values{"token": {"s3cret-token-0123456789"}, "next": {"//attacker.example/"}})
	require.Equal(t, http.StatusSeeOther, code)
	code, body := c.get("/ledger")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "oncall-bob")
	code, body = c.post("/ledger/resolve", url.Values{"id": {eff}, "as": {"retry"}, "reason": {"target never saw it"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"oncall-bob: unknown -> pending: target never saw it"}, f.audit(eff))

	script := f.serve(console.Config{Tokens: map[string]string{"deploy-bot": "another-token-0123456789"}})
	script.header = http.Header{"Authorization": {"Bearer another-token-0123456789"}}
	code, body = script.post("/ledger/resolve", url.Values{"id": {eff}, "as": {"succeeded"}, "reason": {"reconciled"}})
	require.Equal(t, http.StatusOK, code, "a bearer header is not sent by a browser on its own: no CSRF token needed: %s", body)
	require.Equal(t, "deploy-bot: pending -> succeeded: reconciled", f.audit(eff)[1])
}

func TestNewRefusesAConfigItCannotUseSafely(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, cfg := range []console.Config{
		{},
		{Pool: f.pool, Tokens: map[string]string{"bob": "short"}},
		{Pool: f.pool, BasicAuth: map[string]string{"a:b": "pw"}},
		{Pool: f.pool, Prefix: "console"},
		{Pool: f.pool, Tables: idem.Tables{Prefix: strings.Repeat("p", 60)}},
	} {
		_, err := console.New(cfg)
		require.True(t, errors.Is(err, idem.ErrConfig), "%+v: %v", cfg, err)
	}
}

func TestMountedUnderAPrefixEveryLinkAndFormKeepsIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dl := f.deadLetter("billing", "m-1", "max_attempts", nil)
	eff := f.effect("o-1", ledger.StatusUnknown)
	c, err := console.New(console.Config{Pool: f.pool, Tables: f.tables, Prefix: "/console"})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	mux := http.NewServeMux()
	mux.Handle("/console/", c)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	cl := &client{t: t, base: srv.URL + "/console", http: &http.Client{Jar: jar}}
	link := regexp.MustCompile(`(?:href|action)="([^"]*)"`)
	for _, path := range screens(dl, eff) {
		code, body := cl.get(path)
		require.Equal(t, http.StatusOK, code, path)
		for _, m := range link.FindAllStringSubmatch(body, -1) {
			require.True(t, strings.HasPrefix(m[1], "/console/"), "%s links to %s", path, m[1])
		}
	}
	code, body := cl.post("/ledger/resolve", url.Values{"id": {eff}, "as": {"retry"}, "reason": {"under a prefix"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "pending", f.status(eff))
	resp, err := srv.Client().Get(srv.URL + "/consolex")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}
