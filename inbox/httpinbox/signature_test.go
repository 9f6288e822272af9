package httpinbox_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// signed returns a request with body and the given header values.
func signed(body string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func TestTimestampedHMACAcceptsOnlyAuthenticFreshSignatures(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	old, current := []byte("whsec_old"), []byte("whsec_current")
	v := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{current, old}}
	body := `{"id":"evt_1","type":"capture.settled"}`

	// The scheme, spelled out: hex HMAC-SHA256(secret, "<t>.<body>").
	h := hmac.New(sha256.New, current)
	fmt.Fprintf(h, "%d.%s", now.Unix(), body)
	want := fmt.Sprintf("t=%d,v1=%s", now.Unix(), hex.EncodeToString(h.Sum(nil)))
	require.Equal(t, want, v.Sign([]byte(body), now))

	verify := func(body string, header ...string) error {
		return v.Verify(signed(body, header...), []byte(body), now)
	}
	require.NoError(t, verify(body, "Gateway-Signature", want))
	rotated := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{old}}
	require.NoError(t, verify(body, "Gateway-Signature", rotated.Sign([]byte(body), now)), "the previous secret still signs")
	require.NoError(t, verify(body, "Gateway-Signature", " t="+fmt.Sprint(now.Unix())+" , v1=00ff, "+strings.Split(want, ",")[1]+",v0=zz"),
		"one good v1 among others")
	require.NoError(t, verify(body, "Gateway-Signature", v.Sign([]byte(body), now.Add(-5*time.Minute))), "at the tolerance")

	for name, c := range map[string]struct {
		err    error
		body   string
		header []string
	}{
		"no header":          {httpinbox.ErrSignatureMissing, body, nil},
		"empty header":       {httpinbox.ErrSignatureMissing, body, []string{"Gateway-Signature", ""}},
		"other secret":       {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", (&httpinbox.TimestampedHMAC{Header: "x", Secrets: [][]byte{[]byte("forged")}}).Sign([]byte(body), now)}},
		"tampered body":      {httpinbox.ErrSignatureInvalid, strings.Replace(body, "evt_1", "evt_2", 1), []string{"Gateway-Signature", want}},
		"timestamp changed":  {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", strings.Replace(want, fmt.Sprint(now.Unix()), fmt.Sprint(now.Unix()+1), 1)}},
		"no timestamp":       {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", strings.Split(want, ",")[1]}},
		"two timestamps":     {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", want + ",t=1"}},
		"no v1":              {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", strings.Split(want, ",")[0]}},
		"negative timestamp": {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", "t=-1,v1=00"}},
		"two headers":        {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", want, "Gateway-Signature", want}},
		"stale":              {httpinbox.ErrSignatureStale, body, []string{"Gateway-Signature", v.Sign([]byte(body), now.Add(-5*time.Minute-time.Second))}},
		"from the future":    {httpinbox.ErrSignatureStale, body, []string{"Gateway-Signature", v.Sign([]byte(body), now.Add(6*time.Minute))}},
		"too many elements":  {httpinbox.ErrSignatureInvalid, body, []string{"Gateway-Signature", want + strings.Repeat(",v1=00", 40)}},
	} {
		require.ErrorIs(t, verify(c.body, c.header...), c.err, name)
	}
}

func TestGitHubSignatureIsCheckedAgainstTheBody(t *testing.T) {
	t.Parallel()
	// The example of GitHub's documentation on validating webhook deliveries.
	v := httpinbox.GitHub([]byte("It's a Secret to Everybody"))
	body := "Hello, World!"
	const want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	require.Equal(t, want, v.Sign([]byte(body)))
	now := time.Now()
	require.NoError(t, v.Verify(signed(body, "X-Hub-Signature-256", want), []byte(body), now))
	require.ErrorIs(t, v.Verify(signed(body), []byte(body), now), httpinbox.ErrSignatureMissing)
	require.ErrorIs(t, v.Verify(signed("Hello, World?", "X-Hub-Signature-256", want), []byte("Hello, World?"), now), httpinbox.ErrSignatureInvalid)
	require.ErrorIs(t, v.Verify(signed(body, "X-Hub-Signature-256", strings.TrimPrefix(want, "sha256=")), []byte(body), now),
		httpinbox.ErrSignatureInvalid, "the prefix is part of the scheme")
	require.ErrorIs(t, v.Verify(signed(body, "X-Hub-Signature-256", "sha256=zz"), []byte(body), now), httpinbox.ErrSignatureInvalid)
}

func TestBodyHMACChecksASignedTimestampOnlyAfterTheSignature(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	sentAt := func(_ *http.Request, body []byte) (time.Time, error) {
		var unix int64
		_, err := fmt.Sscanf(string(body), `{"sent":%d}`, &unix)
		return time.Unix(unix, 0), err
	}
	v := &httpinbox.BodyHMAC{Header: "X-Signature", Base64: true, Secrets: [][]byte{[]byte("s3cret")}, Timestamp: sentAt, Tolerance: time.Minute}
	fresh := fmt.Sprintf(`{"sent":%d}`, now.Unix())
	stale := fmt.Sprintf(`{"sent":%d}`, now.Add(-2*time.Minute).Unix())
	require.NoError(t, v.Verify(signed(fresh, "X-Signature", v.Sign([]byte(fresh))), []byte(fresh), now))
	require.ErrorIs(t, v.Verify(signed(stale, "X-Signature", v.Sign([]byte(stale))), []byte(stale), now), httpinbox.ErrSignatureStale)
	require.ErrorIs(t, v.Verify(signed(stale, "X-Signature", v.Sign([]byte(fresh))), []byte(stale), now), httpinbox.ErrSignatureInvalid,
		"a forged body is invalid, not stale: its time is never read")
	require.ErrorIs(t, v.Verify(signed("{}", "X-Signature", v.Sign([]byte("{}"))), []byte("{}"), now), httpinbox.ErrSignatureInvalid)
}
