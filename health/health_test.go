package health_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/health"
)

func get(t *testing.T, h http.Handler, method, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code, rec.Body.String()
}

func TestProbesAnswer200OnlyWhenEveryReporterIsLiveOrReady(t *testing.T) {
	t.Parallel()
	var db, loop atomic.Value
	db.Store(health.Status{Component: "dispatcher", Ready: true, Live: true})
	loop.Store(health.Status{Component: "consumer", Ready: true, Live: true})
	h := health.Handler(
		health.ReporterFunc(func() health.Status { return db.Load().(health.Status) }),
		health.ReporterFunc(func() health.Status { return loop.Load().(health.Status) }),
	)
	for _, p := range []string{health.LivenessPath, health.ReadinessPath} {
		code, body := get(t, h, http.MethodGet, p)
		require.Equal(t, http.StatusOK, code, p)
		require.JSONEq(t, `{"ok":true,"checks":[{"component":"dispatcher","ready":true,"live":true},
			{"component":"consumer","ready":true,"live":true}]}`, body)
	}

	// Disconnected: not ready, still live.
	db.Store(health.Status{Component: "dispatcher", Live: true, Reason: "database: connection refused"})
	code, body := get(t, h, http.MethodGet, health.ReadinessPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	var rep struct {
		OK     bool `json:"ok"`
		Checks []struct {
			Component, Reason string
			Ready, Live       bool
		} `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &rep))
	require.False(t, rep.OK)
	require.Equal(t, "database: connection refused", rep.Checks[0].Reason)
	code, _ = get(t, h, http.MethodGet, health.LivenessPath)
	require.Equal(t, http.StatusOK, code, "a component waiting for its database is not restarted")

	// Wedged: not live.
	loop.Store(health.Status{Component: "consumer", Ready: true, Reason: "no batch completed for 5m0s"})
	code, _ = get(t, h, http.MethodGet, health.LivenessPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, body = get(t, h, http.MethodHead, health.LivenessPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Empty(t, body)
}

func TestHandlerRejectsOtherPathsAndMethods(t *testing.T) {
	t.Parallel()
	h := health.Handler()
	code, _ := get(t, h, http.MethodGet, "/metrics")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, h, http.MethodPost, health.LivenessPath)
	require.Equal(t, http.StatusMethodNotAllowed, code)
	code, body := get(t, h, http.MethodGet, health.ReadinessPath)
	require.Equal(t, http.StatusOK, code, "no reporters, nothing wrong")
	require.JSONEq(t, `{"ok":true,"checks":[]}`, body)
}

func TestListenAndServeServesUntilItsContextEnds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- health.ListenAndServe(ctx, addr, health.ReporterFunc(func() health.Status {
			return health.Status{Component: "x", Ready: true, Live: true}
		}))
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + health.ReadinessPath)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe did not return")
	}

	// An address it cannot listen on is an error at once.
	require.Error(t, health.ListenAndServe(context.Background(), "256.0.0.1:1"))
}
