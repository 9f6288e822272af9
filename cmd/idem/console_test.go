package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startConsole runs `idem console ARGS` on the fixture's schema and returns
// the URL it serves; the console stops when the test ends.
func startConsole(t *testing.T, f *cliFixture, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"console", "--addr", "127.0.0.1:0", "--pg-url", testdb.URL(), "--schema", f.tables.Schema},
			args...), &out, &errOut)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			require.Equal(t, 0, c, errOut.String())
		case <-time.After(10 * time.Second):
			t.Error("idem console did not stop within 10s of its interrupt")
		}
	})
	urlRE := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/`)
	var url string
	require.Eventually(t, func() bool {
		url = urlRE.FindString(out.String())
		return url != ""
	}, 15*time.Second, 10*time.Millisecond, "stdout: %s\nstderr: %s", &out, &errOut)
	return url
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestConsoleRefusesToListenBeyondLoopbackWithoutAuthentication(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080", "192.0.2.1:8080"} {
		out, stderr, code := idemCmd("console", "--addr", addr, "--pg-url", nowhere)
		require.Equal(t, 2, code, addr)
		require.Empty(t, out)
		require.Contains(t, stderr, "refusing to listen on "+addr+" without authentication", addr)
		require.Contains(t, stderr, "--token NAME:TOKEN")
	}
	// With authentication it goes on, to the database (nowhere: exit 1).
	_, stderr, code := idemCmd("console", "--addr", "0.0.0.0:0", "--basic-auth", "alice:pw", "--pg-url", nowhere)
	require.Equal(t, 1, code, stderr)
	require.NotContains(t, stderr, "refusing")
}

func TestConsoleServesEveryScreenOnLoopback(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	url := startConsole(t, f)
	for _, path := range []string{"", "deadletters", "deadletters/1", "ledger", "ledger/effect?id=" + f.effectID, "http", "replays",
		"partitions"} {
		code, body := get(t, url+path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		require.Contains(t, body, "idem console", path)
	}
	_, body := get(t, url+"deadletters")
	require.Contains(t, body, "gateway down")
	require.Contains(t, body, `method="post"`)
}

func TestConsoleReadOnlyServesNoForms(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	url := startConsole(t, f, "--read-only")
	for _, path := range []string{"", "deadletters", "deadletters/1", "ledger", "ledger/effect?id=" + f.effectID, "http", "replays"} {
		code, body := get(t, url+path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, strings.ToLower(body), "<form method=\"post\"", path)
	}
	resp, err := http.Post(url+"ledger/resolve", "application/x-www-form-urlencoded", strings.NewReader("id="+f.effectID+"&as=failed&reason=r"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}
