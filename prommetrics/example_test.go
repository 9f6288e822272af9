package prommetrics_test

import (
	"flag"
	"log"
	"log/slog"

	"github.com/idemkit/idem/prommetrics"
)

// A worker's main: -metrics-addr turns the Prometheus endpoint on; after
// SetGlobal, every idem component created with its default MeterProvider
// reports to it.
func ExampleServe() {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	_ = fs.Parse([]string{"-metrics-addr", "127.0.0.1:9464"})

	metrics, err := prommetrics.Serve(*metricsAddr, slog.Default())
	if err != nil {
		log.Fatal(err)
	}
	defer metrics.Close()
	metrics.SetGlobal() // every component created from here on reports to it
	// … create the consumer and the dispatcher, run them until shutdown.
}
