package ledger

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHTTPAnswersAreClassifiedByWhatTheyProve(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	retryAfter := http.Header{"Retry-After": {"7"}}
	cases := []struct {
		name       string
		code       int
		header     http.Header
		body       string
		status     Status
		after      time.Duration
		inProgress bool
	}{
		{"200", 200, nil, "", StatusSucceeded, 0, false},
		{"201 with Retry-After", 201, retryAfter, "", StatusSucceeded, 0, false},
		{"302", 302, nil, "", StatusFailedTerminal, 0, false},
		{"400", 400, nil, "", StatusFailedTerminal, 0, false},
		{"404", 404, nil, "", StatusFailedTerminal, 0, false},
		{"409 business conflict", 409, nil, `{"code":"ALREADY_CAPTURED"}`, StatusFailedTerminal, 0, false},
		{"409 in progress, idem's code", 409, nil, `{"code":"IDEMPOTENCY_REQUEST_IN_PROGRESS"}`, StatusUnknown, 0, true},
		{"409 in progress, Stripe's code", 409, nil, `{"error":{"code":"idempotency_key_in_use"}}`, StatusUnknown, 0, true},
		{"409 with Retry-After", 409, retryAfter, "", StatusUnknown, 7 * time.Second, true},
		{"409 with a body that is not JSON", 409, nil, "in progress", StatusFailedTerminal, 0, false},
		{"408", 408, nil, "", StatusFailedRetryable, 0, false},
		{"422", 422, nil, "", StatusFailedTerminal, 0, false},
		{"425", 425, retryAfter, "", StatusFailedRetryable, 7 * time.Second, false},
		{"429", 429, nil, "", StatusFailedRetryable, 0, false},
		{"429 with Retry-After", 429, retryAfter, "", StatusFailedRetryable, 7 * time.Second, false},
		{"500", 500, nil, "", StatusUnknown, 0, false},
		{"501", 501, nil, "", StatusFailedTerminal, 0, false},
		{"502", 502, nil, "", StatusUnknown, 0, false},
		{"503", 503, nil, "", StatusUnknown, 0, false},
		{"503 with Retry-After", 503, retryAfter, "", StatusFailedRetryable, 7 * time.Second, false},
		{"503 with an unreadable Retry-After", 503, http.Header{"Retry-After": {"soon"}}, "", StatusFailedRetryable, 0, false},
		{"504", 504, retryAfter, "", StatusUnknown, 7 * time.Second, false},
		{"505", 505, nil, "", StatusFailedTerminal, 0, false},
		{"599", 599, nil, "", StatusUnknown, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.header
			if h == nil {
				h = http.Header{}
			}
			status, after, inProgress := classifyHTTP(c.code, h, []byte(c.body), now)
			require.Equal(t, c.status, status)
			require.Equal(t, c.after, after)
			require.Equal(t, c.inProgress, inProgress)
		})
	}
}
