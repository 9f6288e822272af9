package streamio

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/logs"
)

// RouteClientLogs sends the stream client's logs, which are process-wide and
// go to the standard library's log package by default, to l under the key
// component=rabbitmq-stream. The client reports benign races on connection
// close as errors ("use of closed network connection"), so its levels are
// lowered by one: errors become warnings, warnings info, info debug.
func RouteClientLogs(l *slog.Logger) {
	logs.SetLogger(clientLogger{l.With(slog.String("component", "rabbitmq-stream"))})
}

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) log(level slog.Level, format string, v []any) {
	ctx := context.Background()
	if c.l.Enabled(ctx, level) {
		c.l.Log(ctx, level, fmt.Sprintf(format, v...))
	}
}

func (c clientLogger) Error(format string, v ...any) { c.log(slog.LevelWarn, format, v) }
func (c clientLogger) Warn(format string, v ...any)  { c.log(slog.LevelInfo, format, v) }
func (c clientLogger) Info(format string, v ...any)  { c.log(slog.LevelDebug, format, v) }
func (c clientLogger) Debug(format string, v ...any) { c.log(slog.LevelDebug, format, v) }
