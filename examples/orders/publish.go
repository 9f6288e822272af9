package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

// publishConfig says what publish sends.
type publishConfig struct {
	n    int     // events, duplicates excluded
	dup  float64 // share of events published a second time, a little later
	swap float64 // share of orders whose Paid and Shipped events are swapped
	seed uint64  // the same seed publishes the same events
}

func publishCommand(ctx context.Context, o options, args []string) error {
	fs := flag.NewFlagSet("orders publish", flag.ContinueOnError)
	var cfg publishConfig
	fs.IntVar(&cfg.n, "n", 20000, "events to publish (3 per order), duplicates not counted")
	fs.Float64Var(&cfg.dup, "dup", 0.03, "share of events published twice (same id, same body)")
	fs.Float64Var(&cfg.swap, "swap", 0.01, "share of orders whose OrderShipped comes before OrderPaid")
	fs.Uint64Var(&cfg.seed, "seed", 1, "random seed: the same seed publishes the same events")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	sent, err := publish(ctx, o, cfg)
	if err != nil {
		return err
	}
	o.logger.Info("published", "stream", o.stream, "events", cfg.n, "messages", len(sent),
		"duplicates", len(sent)-cfg.n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// events returns the stream cfg describes: orders o-1, o-2 … each placed,
// paid and shipped, interleaved over 64 orders in progress; in some orders
// shipped comes before paid (a gap, then a stale event); some events come
// again up to 50 positions later, as when a producer retries.
func events(cfg publishConfig) []streamio.Outgoing {
	r := rand.New(rand.NewPCG(cfg.seed, 0x6f72646572))
	const window = 64
	var active [][]event
	var base []event
	for order := 1; len(base) < cfg.n; {
		for len(active) < window {
			id := fmt.Sprintf("o-%d", order)
			order++
			evs := []event{{id, 1, "OrderPlaced"}, {id, 2, "OrderPaid"}, {id, 3, "OrderShipped"}}
			if r.Float64() < cfg.swap {
				evs[1], evs[2] = evs[2], evs[1]
			}
			active = append(active, evs)
		}
		i := r.IntN(len(active))
		base = append(base, active[i][0])
		if active[i] = active[i][1:]; len(active[i]) == 0 {
			active = append(active[:i], active[i+1:]...)
		}
	}
	type delayed struct {
		at int
		m  streamio.Outgoing
	}
	var later []delayed
	out := make([]streamio.Outgoing, 0, cfg.n+int(float64(cfg.n)*cfg.dup)+8)
	for i, ev := range base {
		body, _ := json.Marshal(ev)
		m := streamio.Outgoing{MessageID: fmt.Sprintf("evt-%s-%d", ev.OrderID, ev.Version), Body: body, ContentType: "application/json"}
		out = append(out, m)
		if r.Float64() < cfg.dup {
			later = append(later, delayed{at: i + 1 + r.IntN(50), m: m})
		}
		keep := later[:0]
		for _, d := range later {
			if d.at <= i {
				out = append(out, d.m)
			} else {
				keep = append(keep, d)
			}
		}
		later = keep
	}
	for _, d := range later {
		out = append(out, d.m)
	}
	return out
}

// publish appends the events of cfg to the stream, declaring it first.
func publish(ctx context.Context, o options, cfg publishConfig) ([]streamio.Outgoing, error) {
	env, err := streamio.Open(ctx, streamio.Config{URI: o.streamURL, Logger: o.logger})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	if err := env.DeclareStream(ctx, o.stream, streamio.StreamOptions{}); err != nil {
		return nil, err
	}
	out := events(cfg)
	const chunk = 5000
	for i := 0; i < len(out); i += chunk {
		if err := env.Publish(ctx, o.stream, out[i:min(i+chunk, len(out))]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
