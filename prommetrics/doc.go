// Package prommetrics serves idem's OpenTelemetry metrics to Prometheus: one
// call in a worker's main makes every idem instrument (consumer, ledger
// dispatcher, HTTP edge) scrapeable at /metrics, through the OpenTelemetry
// Prometheus exporter.
//
// # Serving /metrics
//
// Serve creates a MeterProvider that exports through the Prometheus
// exporter and serves it on an address of your choice. It leaves
// OpenTelemetry's global provider alone unless asked: give
// Server.MeterProvider to the consumer, the dispatcher and the HTTP
// middleware in their Configs, or call Server.SetGlobal before creating
// them, since each takes the global provider when its Config names none.
// An empty address turns it off, so a flag can decide:
//
//	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
//	_ = fs.Parse([]string{"-metrics-addr", "127.0.0.1:9464"})
//
//	metrics, err := prommetrics.Serve(*metricsAddr, slog.Default())
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer metrics.Close()
//	metrics.SetGlobal() // every component created from here on reports to it
//
// The example workers take the same -metrics-addr flag.
//
// # Names
//
// Names are translated the Prometheus way: idem.consumer.messages becomes
// idem_consumer_messages_total, a duration in seconds gets _seconds, dots
// become underscores. Attributes become labels; none of them holds a message
// id or another high-cardinality value, which stay on spans.
//
// # Already using OpenTelemetry
//
// An application that configures its own OpenTelemetry SDK (an OTLP
// exporter to a collector, say) does not need this package: every idem
// component takes a MeterProvider in its Config and falls back to the global
// one. The guide docs/observability.md lists every metric with the Grafana
// dashboard that reads them.
package prommetrics
