# The two commands a new user needs: `make demo` and `make test`.
# Both start PostgreSQL and RabbitMQ first (scripts/services.sh).

GO ?= go
TEST_TIMEOUT ?= 25m

.PHONY: demo demo-quickstart demo-payments test soak services vet bench cluster-test cluster-bench soak-cluster path

# demo: the quickstart worker, then the payments chain
# (HTTP Idempotency-Key → outbox → worker → ledger → gateway with faults).
demo: demo-quickstart demo-payments

demo-quickstart: services
	$(GO) run ./examples/quickstart demo

demo-payments: services
	$(GO) run ./examples/payments demo

test: services vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) soak

# soak: the examples end to end under faults (SIGKILL, closed connections,
# terminated sessions, a dispatcher killed mid-call, a faulty gateway, hung
# and process-killing handlers, three competing worker processes, an inbox
# cleanup at the floor while replays and redrives go on), then the
# invariants. Needs rabbitmqctl and ss on this machine, as root.
soak: services
	$(GO) run ./internal/soak -n 2000 -rate 60 -fault-every 4s -duration-cap 2m

services:
	./scripts/services.sh

# cluster-test: the tests tagged `cluster` (the packages that have them) on
# the production topology of scripts/cluster.sh: a private 3-node RabbitMQ
# cluster and a PostgreSQL primary with a streaming standby, on spare ports.
# It starts the topology, runs the packages one at a time (their faults are
# cluster-wide) and removes the topology afterwards, pass or fail. It runs
# the tests of the cluster-tagged files only (their packages' other tests
# are make test's); CLUSTER_RUN narrows them, as go test -run.
CLUSTER_TEST_TIMEOUT ?= 30m
CLUSTER_FILES = $(shell grep -rlE --include='*_test.go' '^//go:build.*\bcluster\b' .)
CLUSTER_PKGS = $(sort $(dir $(CLUSTER_FILES)))
CLUSTER_TESTS = $(if $(CLUSTER_FILES),$(shell grep -hoE '^func Test[A-Za-z0-9_]+' $(CLUSTER_FILES) | sed 's/^func //' | paste -sd'|'))
CLUSTER_RUN ?= ^($(CLUSTER_TESTS))$$

cluster-test: services
	status=0; \
	./scripts/cluster.sh up >/dev/null && \
	IDEM_CLUSTER=1 $(GO) test -race -count=1 -p 1 -tags cluster -timeout $(CLUSTER_TEST_TIMEOUT) \
		-run '$(CLUSTER_RUN)' $(CLUSTER_PKGS) || status=$$?; \
	./scripts/cluster.sh down; \
	exit $$status

# soak-cluster: the soak on the topology of scripts/cluster.sh, with
# synchronous replication: beside SIGKILLed workers and closed connections it
# kills RabbitMQ nodes (kill -9, started again) and fails the PostgreSQL
# primary over (the old one rejoins as a standby), then checks the
# invariants, on every example and the liveness worker.
# Like cluster-test, it starts the topology and removes it afterwards, pass
# or fail. Not part of `make test`: a few minutes more.
soak-cluster:
	status=0; \
	urls=$$(./scripts/cluster.sh up --sync) && eval "$$urls" && \
	IDEM_AMQP_URL="$$IDEM_CLUSTER_AMQP_URLS" IDEM_STREAM_URL="$$IDEM_CLUSTER_STREAM_URLS" IDEM_PG_URL="$$IDEM_CLUSTER_PG_URL" \
		$(GO) run ./internal/soak -n 2000 -rate 60 -fault-every 4s -duration-cap 3m \
		-faults node,pgfailover,kill,connections || status=$$?; \
	./scripts/cluster.sh down; \
	exit $$status

vet:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags cluster ./...

# bench: every figure of BENCHMARKS.md, each against its same-run baseline
# (the large soak is `go run ./internal/soak` with the flags it gives).
bench: services
	$(GO) run ./bench/consumer -repeat 5
	$(GO) run ./bench/competing -n 30000 -repeat 3
	$(GO) run ./bench/partitions -repeat 3
	$(GO) test -run '^$$' -bench ProcessBatch -benchmem -count 3 ./consumer
	$(GO) test -run '^$$' -bench Claim -benchtime 3s ./inbox/
	$(GO) test -run '^$$' -bench BenchmarkDispatchHTTP -benchtime 20000x -count 3 ./ledger
	$(GO) test -run '^$$' -bench RecordEffectOverhead -benchtime 10000x -count 3 ./examples/payments/
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 3 ./inbox/httpinbox/
	$(GO) test -run '^$$' -bench RawRead -benchtime 5x -count 3 ./internal/streamio
	$(GO) test -run '^$$' -bench Replay -benchtime 3x -count 2 ./replay
	$(GO) test -run '^$$' -bench RebuildOf100k -benchtime 1x -count 3 ./examples/orders
	$(GO) test -run '^$$' -bench DeleteScope -benchtime 1x -count 3 ./inbox/
	$(MAKE) cluster-bench

# cluster-bench: the failover figures of BENCHMARKS.md, on the topology of
# scripts/cluster.sh, started and removed as for cluster-test.
cluster-bench: services
	status=0; \
	./scripts/cluster.sh up >/dev/null && \
	IDEM_CLUSTER=1 $(GO) test -count=1 -tags cluster -timeout $(CLUSTER_TEST_TIMEOUT) \
		-run '^$$' -bench Failover -benchtime 1x -count 3 ./consumer/ || status=$$?; \
	./scripts/cluster.sh down; \
	exit $$status

# path: the library files one new queue message runs, delivery to ack, and
# their count (bench/path); it fails above the eight stations the engine's
# package doc walks.
path: services
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(GO) build -cover -covermode=atomic -coverpkg=github.com/idemkit/idem/... -o "$$tmp/path" ./bench/path && \
	GOCOVERDIR="$$tmp" "$$tmp/path" -go $(GO) -max-stations 8
