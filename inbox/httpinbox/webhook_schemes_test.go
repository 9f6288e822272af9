package httpinbox_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// schemeMAC is HMAC-SHA256(secret, body), computed here rather than with the
// verifier's Sign, so that the tests pin the wire format a provider sends.
func schemeMAC(secret []byte, body string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(body))
	return h.Sum(nil)
}

// githubSignature is GitHub's X-Hub-Signature-256 value for body.
func githubSignature(secret []byte, body string) string {
	return "sha256=" + hex.EncodeToString(schemeMAC(secret, body))
}

// schemeKeyRows counts the key records, of any operation, for an event id:
// a refused delivery must leave none behind.
func schemeKeyRows(f *fixture, id string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+f.tables.Table("http_keys")+` WHERE idempotency_key = $1`, id).Scan(&n))
	return n
}

// requireFirstThenReplay checks a first delivery that ran the handler and a
// duplicate answered, 2xx, with its stored bytes.
func requireFirstThenReplay(t *testing.T, first, dup *httptest.ResponseRecorder) {
	t.Helper()
	require.Equal(t, http.StatusOK, first.Code, first.Body.String())
	require.Empty(t, first.Header().Get(httpinbox.HeaderReplayed), "the first delivery ran the handler")
	require.Equal(t, http.StatusOK, dup.Code, dup.Body.String())
	require.Equal(t, "true", dup.Header().Get(httpinbox.HeaderReplayed), "the duplicate is answered from the record")
	require.Equal(t, first.Body.Bytes(), dup.Body.Bytes())
}

// GitHub names each delivery in the X-GitHub-Delivery header only: the body
// carries no id, so the header alone must key the event.
func TestWebhookEventIDFromAHeaderRunsTheHandlerOncePerID(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{
		Provider: "github", EventID: httpinbox.EventIDHeader("X-GitHub-Delivery")})
	body := `{"action":"opened","issue":{"number":7}}` // no id member
	deliver := func(header ...string) *httptest.ResponseRecorder {
		return f.send("/webhooks/github", body, append([]string{"Gateway-Signature", f.signer.Sign([]byte(body), time.Now())}, header...)...)
	}

	first := deliver("X-GitHub-Delivery", "d-1")
	again := deliver("X-GitHub-Delivery", "d-1")
	requireFirstThenReplay(t, first, again)
	require.JSONEq(t, `{"received":"d-1"}`, first.Body.String(), "the claim's key is the header's value")
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.eventRows("d-1"))

	// The same body under another delivery id is another event: it runs.
	other := deliver("X-GitHub-Delivery", "d-2")
	require.Equal(t, http.StatusOK, other.Code, other.Body.String())
	require.Empty(t, other.Header().Get(httpinbox.HeaderReplayed))
	require.JSONEq(t, `{"received":"d-2"}`, other.Body.String())
	require.EqualValues(t, 2, f.runs.Load())
	require.Equal(t, 1, f.eventRows("d-2"))

	keys, err := f.keys().List(context.Background(), httpinbox.KeyFilter{Operation: "webhook:github"})
	require.NoError(t, err)
	var got []string
	for _, k := range keys {
		got = append(got, k.Caller+"/"+k.Key+"/"+string(k.State))
	}
	require.ElementsMatch(t, []string{"github/d-1/completed", "github/d-2/completed"}, got)

	// No header, or two that disagree, is no event id: refused, nothing kept.
	requireProblem(t, deliver(), http.StatusBadRequest, httpinbox.CodeInvalidEventID)
	requireProblem(t, deliver("X-GitHub-Delivery", "d-3", "X-GitHub-Delivery", "d-4"), http.StatusBadRequest, httpinbox.CodeInvalidEventID)
	require.EqualValues(t, 2, f.runs.Load())
	require.Equal(t, 2, f.records())
}

// GitHub signs the raw body alone: X-Hub-Signature-256 is "sha256=" and the
// hex HMAC-SHA256 under the webhook's secret. A good signature runs the
// handler once per delivery; anything else is refused before the delivery id
// is even read, so it leaves no record and never reaches a stored answer.
func TestGitHubSignedWebhookRunsOnceAndBadSignaturesAreRefusedStoringNothing(t *testing.T) {
	t.Parallel()
	secret := []byte("It's a Secret to Everybody")
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{
		Provider: "github", Verifier: httpinbox.GitHub(secret), EventID: httpinbox.EventIDHeader("X-GitHub-Delivery")})
	body := `{"action":"opened","issue":{"number":7}}`
	good := githubSignature(secret, body)
	legacy := hmac.New(sha1.New, secret) // GitHub's older X-Hub-Signature: not the header checked
	legacy.Write([]byte(body))
	unkeyed := sha256.Sum256([]byte(body))

	for name, c := range map[string]struct {
		code   string
		body   string
		header []string
	}{
		"missing":        {httpinbox.CodeSignatureMissing, body, nil},
		"empty":          {httpinbox.CodeSignatureMissing, body, []string{"X-Hub-Signature-256", ""}},
		"legacy header":  {httpinbox.CodeSignatureMissing, body, []string{"X-Hub-Signature", "sha1=" + hex.EncodeToString(legacy.Sum(nil))}},
		"wrong secret":   {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", githubSignature([]byte("guessed"), body)}},
		"tampered body":  {httpinbox.CodeSignatureInvalid, strings.Replace(body, "opened", "closed", 1), []string{"X-Hub-Signature-256", good}},
		"no prefix":      {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", strings.TrimPrefix(good, "sha256=")}},
		"truncated":      {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", good[:len(good)-2]}},
		"not hex":        {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", "sha256=" + strings.Repeat("z", 64)}},
		"base64 not hex": {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", "sha256=" + base64.StdEncoding.EncodeToString(schemeMAC(secret, body))}},
		"two signatures": {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", good, "X-Hub-Signature-256", good}},
		"unkeyed hash":   {httpinbox.CodeSignatureInvalid, body, []string{"X-Hub-Signature-256", "sha256=" + hex.EncodeToString(unkeyed[:])}},
	} {
		id := "bad-" + strings.ReplaceAll(name, " ", "-")
		rec := f.send("/webhooks/github", c.body, append([]string{"X-GitHub-Delivery", id}, c.header...)...)
		requireProblem(t, rec, http.StatusUnauthorized, c.code)
		require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed), name)
		require.Zero(t, schemeKeyRows(f.fixture, id), "%s: nothing stored", name)
	}
	require.Zero(t, f.runs.Load())
	require.Zero(t, f.records())

	send := func(id, sig string) *httptest.ResponseRecorder {
		return f.send("/webhooks/github", body, "X-GitHub-Delivery", id, "X-Hub-Signature-256", sig)
	}
	requireFirstThenReplay(t, send("d-1", good), send("d-1", good))
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.eventRows("d-1"))

	// Once the delivery is stored, a forged copy of it still gets 401, not
	// the stored answer.
	requireProblem(t, send("d-1", githubSignature([]byte("guessed"), body)), http.StatusUnauthorized, httpinbox.CodeSignatureInvalid)
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.records())
}

// The generic scheme: a header with the HMAC-SHA256 of the raw body, hex or
// base64, after an optional prefix; the event id is in the signed body.
// Secrets rotate: a body signed with the previous secret is still authentic.
func TestBodyHMACSignedWebhookRunsOnceAndBadSignaturesAreRefusedStoringNothing(t *testing.T) {
	t.Parallel()
	current, previous := []byte("s3cret-current"), []byte("s3cret-previous")
	for name, enc := range map[string]struct {
		prefix string
		base64 bool
	}{
		"hex with prefix": {prefix: "v1=", base64: false},
		"base64":          {prefix: "", base64: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := &httpinbox.BodyHMAC{Header: "X-Signature", Prefix: enc.prefix, Base64: enc.base64, Secrets: [][]byte{current, previous}}
			f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{Provider: "acme", Verifier: v})
			sign := func(secret []byte, body string) string {
				if enc.base64 {
					return enc.prefix + base64.StdEncoding.EncodeToString(schemeMAC(secret, body))
				}
				return enc.prefix + hex.EncodeToString(schemeMAC(secret, body))
			}
			otherEncoding := func(secret []byte, body string) string {
				if enc.base64 {
					return enc.prefix + hex.EncodeToString(schemeMAC(secret, body))
				}
				return enc.prefix + base64.StdEncoding.EncodeToString(schemeMAC(secret, body))
			}
			event := func(id string) string { return fmt.Sprintf(`{"id":%q,"type":"invoice.paid"}`, id) }

			for name, c := range map[string]struct {
				code   string
				id     string
				header []string
			}{
				"missing":        {httpinbox.CodeSignatureMissing, "evt_missing", nil},
				"wrong secret":   {httpinbox.CodeSignatureInvalid, "evt_forged", []string{"X-Signature", sign([]byte("guessed"), event("evt_forged"))}},
				"tampered body":  {httpinbox.CodeSignatureInvalid, "evt_tampered", []string{"X-Signature", sign(current, event("evt_original"))}},
				"other encoding": {httpinbox.CodeSignatureInvalid, "evt_encoding", []string{"X-Signature", otherEncoding(current, event("evt_encoding"))}},
				"garbage":        {httpinbox.CodeSignatureInvalid, "evt_garbage", []string{"X-Signature", enc.prefix + "%%%"}},
			} {
				rec := f.send("/webhooks/acme", event(c.id), c.header...)
				requireProblem(t, rec, http.StatusUnauthorized, c.code)
				require.Zero(t, schemeKeyRows(f.fixture, c.id), "%s: nothing stored", name)
			}
			if enc.prefix != "" {
				body := event("evt_noprefix")
				requireProblem(t, f.send("/webhooks/acme", body, "X-Signature", strings.TrimPrefix(sign(current, body), enc.prefix)),
					http.StatusUnauthorized, httpinbox.CodeSignatureInvalid)
			}
			require.Zero(t, f.runs.Load())
			require.Zero(t, f.records())

			body := event("evt_1")
			send := func(secret []byte, body string) *httptest.ResponseRecorder {
				return f.send("/webhooks/acme", body, "X-Signature", sign(secret, body))
			}
			requireFirstThenReplay(t, send(current, body), send(current, body))
			// The provider still signing with the old secret: authentic, and
			// the same event, so replayed too.
			require.Equal(t, "true", send(previous, body).Header().Get(httpinbox.HeaderReplayed))
			require.EqualValues(t, 1, f.runs.Load())
			require.Equal(t, 1, f.eventRows("evt_1"))
			rotated := send(previous, event("evt_2"))
			require.Equal(t, http.StatusOK, rotated.Code, rotated.Body.String())
			require.Empty(t, rotated.Header().Get(httpinbox.HeaderReplayed))
			require.EqualValues(t, 2, f.runs.Load())

			// A forgery of a stored event never reaches its stored answer.
			requireProblem(t, send([]byte("guessed"), body), http.StatusUnauthorized, httpinbox.CodeSignatureInvalid)
			require.EqualValues(t, 2, f.runs.Load())
			require.Equal(t, 2, f.records())
		})
	}
}

// With Timestamp set, BodyHMAC bounds replays by the send time inside the
// signed body: an authentic but stale (or future) event is refused 401
// before its id is looked up, and nothing is stored or run.
func TestBodyHMACWebhookRefusesAStaleSignedTimestampStoringNothing(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret")
	v := &httpinbox.BodyHMAC{Header: "X-Signature", Secrets: [][]byte{secret}, Tolerance: time.Minute,
		Timestamp: func(_ *http.Request, body []byte) (time.Time, error) {
			var ev struct{ Sent *int64 }
			if err := json.Unmarshal(body, &ev); err != nil || ev.Sent == nil {
				return time.Time{}, fmt.Errorf("no sent member: %v", err)
			}
			return time.Unix(*ev.Sent, 0), nil
		}}
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{Provider: "acme", Verifier: v})
	now := time.Now()
	event := func(id string, sent time.Time) string { return fmt.Sprintf(`{"id":%q,"sent":%d}`, id, sent.Unix()) }
	send := func(secret []byte, body string) *httptest.ResponseRecorder {
		return f.send("/webhooks/acme", body, "X-Signature", hex.EncodeToString(schemeMAC(secret, body)))
	}

	for id, c := range map[string]struct {
		code string
		body string
		sig  []byte
	}{
		"evt_stale":   {httpinbox.CodeSignatureStale, event("evt_stale", now.Add(-2*time.Minute)), secret},
		"evt_future":  {httpinbox.CodeSignatureStale, event("evt_future", now.Add(2*time.Minute)), secret},
		"evt_no_time": {httpinbox.CodeSignatureInvalid, `{"id":"evt_no_time"}`, secret},
		// A forged stale body is invalid, not stale: its time is never trusted.
		"evt_forged": {httpinbox.CodeSignatureInvalid, event("evt_forged", now.Add(-2*time.Minute)), []byte("guessed")},
	} {
		requireProblem(t, send(c.sig, c.body), http.StatusUnauthorized, c.code)
		require.Zero(t, schemeKeyRows(f.fixture, id), "%s: nothing stored", id)
	}
	require.Zero(t, f.runs.Load())
	require.Zero(t, f.records())

	fresh := event("evt_1", now.Add(-30*time.Second))
	requireFirstThenReplay(t, send(secret, fresh), send(secret, fresh))
	require.EqualValues(t, 1, f.runs.Load())

	// The same event id re-sent with a stale time is refused as stale, not
	// compared with the stored event (422) nor answered from it.
	requireProblem(t, send(secret, event("evt_1", now.Add(-2*time.Minute))), http.StatusUnauthorized, httpinbox.CodeSignatureStale)
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.records())
}
