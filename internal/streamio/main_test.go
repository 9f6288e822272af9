package streamio

import (
	"log/slog"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The client's close races are noise in test output; failures show in
	// the assertions.
	RouteClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}
