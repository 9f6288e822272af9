package streamio

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/internal/streamclient/logs"
)

// The stream client logs through one process-wide logger (by default the
// standard library's log package). idem installs a router in its place
// once, before the first connection, and the router sends every line to the
// current target: the Logger of the Env opened last, or the logger pinned by
// RouteClientLogs. Installing once and swapping the target atomically keeps
// the client's unsynchronised logger variable from being written while its
// goroutines read it.
var (
	installOnce sync.Once
	target      atomic.Pointer[slog.Logger]
	pinned      atomic.Bool
)

func install() { installOnce.Do(func() { logs.SetLogger(router{}) }) }

// RouteClientLogs sends the stream client's logs to l under the key
// component=rabbitmq-stream, for the whole process, whatever Logger later
// Envs are opened with. Without it, Open sends them to its Config.Logger.
// The client reports benign races on connection close as errors ("use of
// closed network connection"), so its levels are lowered by one: errors
// become warnings, warnings info, info debug.
func RouteClientLogs(l *slog.Logger) {
	install()
	pinned.Store(true)
	target.Store(l.With(slog.String("component", "rabbitmq-stream")))
}

// routeTo makes l the target of the client's logs unless RouteClientLogs
// pinned one.
func routeTo(l *slog.Logger) {
	install()
	if !pinned.Load() {
		target.Store(l.With(slog.String("component", "rabbitmq-stream")))
	}
}

type router struct{}

func (router) log(level slog.Level, format string, v []any) {
	l := target.Load()
	if l == nil {
		return
	}
	ctx := context.Background()
	if l.Enabled(ctx, level) {
		l.Log(ctx, level, fmt.Sprintf(format, v...))
	}
}

func (r router) Error(format string, v ...any) {
	level := slog.LevelWarn
	if msg := fmt.Sprintf(format, v...); closingRace(msg) {
		level = slog.LevelDebug
	}
	r.log(level, format, v)
}

// closingRace reports whether msg is the client failing to answer the
// server's close of a connection that idem itself was closing (the client
// closed its socket first): routine each time a short-lived connection,
// such as a lag or tail query's, ends, and nothing a person need look at.
func closingRace(msg string) bool {
	return strings.Contains(msg, "closeFrameHandler") && strings.Contains(msg, "use of closed network connection")
}
func (r router) Warn(format string, v ...any)  { r.log(slog.LevelInfo, format, v) }
func (r router) Info(format string, v ...any)  { r.log(slog.LevelDebug, format, v) }
func (r router) Debug(format string, v ...any) { r.log(slog.LevelDebug, format, v) }
