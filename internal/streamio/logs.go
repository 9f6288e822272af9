package streamio

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/logs"
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

func (r router) Error(format string, v ...any) { r.log(slog.LevelWarn, format, v) }
func (r router) Warn(format string, v ...any)  { r.log(slog.LevelInfo, format, v) }
func (r router) Info(format string, v ...any)  { r.log(slog.LevelDebug, format, v) }
func (r router) Debug(format string, v ...any) { r.log(slog.LevelDebug, format, v) }
