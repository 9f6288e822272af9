# The two commands a new user needs: `make demo` and `make test`.
# Both start PostgreSQL and RabbitMQ first (scripts/services.sh).

GO ?= go
TEST_TIMEOUT ?= 25m

.PHONY: demo demo-quickstart demo-payments test soak services vet bench cluster-test cluster-bench soak-cluster path scale console-test alerts-test fuzz chaos chaos-cluster

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
	$(GO) run ./internal/testkit/soak -n 2000 -rate 60 -fault-every 4s -duration-cap 2m

# chaos: the generative soak (internal/testkit/chaos, docs/testing.md):
# seeded schedules of publishes, charges to a faulty gateway, stream
# replays and rebuilds, HTTP requests, kills, partitions joining and
# leaving, connection cuts, PostgreSQL outages, redrives and resolves, run
# against real workers and checked by an oracle, for CHAOS_DURATION. It prints its
# seed (a fresh one unless SEED=N); a failing schedule is shrunk and saved
# under testdata/chaos/, which make test replays. CHAOS_PLAN=1 prints the
# schedule of SEED, one action a line, and exits.
CHAOS_DURATION ?= 3m
chaos: $(if $(CHAOS_PLAN),,services)
	$(GO) run ./internal/testkit/chaos -duration $(CHAOS_DURATION) $(if $(SEED),-seed $(SEED)) $(if $(CHAOS_PLAN),-plan)

# chaos-cluster: the generative soak on the topology of scripts/cluster.sh
# (up --sync: 3 RabbitMQ nodes, a PostgreSQL primary and a synchronous
# standby), for CHAOS_DURATION (and at most as long again while an invariant
# is still unchecked: its schedules are slower): the schedules of make chaos plus kill -9 of
# a RabbitMQ node (started again a few actions later) and crashes of the
# PostgreSQL primary (pg_ctl -m immediate), started again (crash recovery)
# or failed over to the standby. Like cluster-test it starts the topology
# and removes it afterwards, pass or fail. A failing schedule is shrunk and
# saved under testdata/chaos/cluster/, which make test does not replay;
# CHAOS_CASE=FILE replays one. CHAOS_PLAN=1 prints the schedule of SEED and
# needs no topology.
chaos-cluster:
	if [ -n "$(CHAOS_PLAN)" ]; then \
		$(GO) run ./internal/testkit/chaos -cluster -plan $(if $(SEED),-seed $(SEED)); exit $$?; \
	fi; \
	status=0; \
	./scripts/cluster.sh up --sync >/dev/null && \
	$(GO) run ./internal/testkit/chaos -cluster -duration $(CHAOS_DURATION) $(if $(SEED),-seed $(SEED)) \
		$(if $(CHAOS_CASE),-case $(CHAOS_CASE)) || status=$$?; \
	./scripts/cluster.sh down; \
	exit $$status

services:
	./scripts/services.sh

# alerts-test: the alert rules of docs/prometheus/idem-alerts.yml, checked
# and run against their unit tests by promtool, which scripts/services.sh
# installs (Debian's prometheus package) when it is missing.
alerts-test:
	./scripts/services.sh --promtool
	@command -v promtool >/dev/null || { echo "alerts-test: promtool is missing: run ./scripts/services.sh (as root on Debian) or put Prometheus's promtool on PATH" >&2; exit 1; }
	promtool check rules docs/prometheus/idem-alerts.yml
	cd docs/prometheus && promtool test rules idem-alerts_test.yml

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

# scale: invariant 18, the tests tagged `scale` (the packages that have
# them): every statement that reads history, through its public door (the
# CLI's `idem cleanup` and lists among them), on tables of a million rows
# and more, with a snapshot held open where it deletes, in custom and
# generic plans; each fails when a statement reads more than 4 rows or index
# entries, or asks for more than 8 heap pages, per row it returns or
# deletes, by the server's own counters (internal/testkit/testdb.Meter). One package
# at a time: a few minutes. SCALE_RUN narrows them, as go test -run.
SCALE_TEST_TIMEOUT ?= 20m
SCALE_FILES = $(shell grep -rlE --include='*_test.go' '^//go:build.*\bscale\b' .)
SCALE_PKGS = $(sort $(dir $(SCALE_FILES)))
SCALE_TESTS = $(if $(SCALE_FILES),$(shell grep -hoE '^func Test[A-Za-z0-9_]+' $(SCALE_FILES) | sed 's/^func //' | paste -sd'|'))
SCALE_RUN ?= ^($(SCALE_TESTS))$$

scale: services
	$(GO) test -count=1 -p 1 -tags scale -timeout $(SCALE_TEST_TIMEOUT) -run '$(SCALE_RUN)' $(SCALE_PKGS)

# console-test: the operator console in headless Chromium (Debian's
# chromium, which scripts/services.sh --chromium installs when it is
# missing) through every screen, on data a real consumer and dispatcher
# make: it redrives a dead letter and resolves an unknown effect through the
# pages, checks the escaping of a hostile message id and that read-only has
# no form, and saves each screen under docs/console/ (the browser tag).
# Each page at depth (a million dead letters, effects and inbox rows: within
# 200 ms, with no sequential scan of those tables) is a scale-tagged test
# that make scale runs.
CONSOLE_TEST_TIMEOUT ?= 20m
console-test:
	./scripts/services.sh --chromium
	$(GO) vet -tags 'browser scale' ./console/
	$(GO) test -race -count=1 -tags browser -timeout $(CONSOLE_TEST_TIMEOUT) -run '^TestAnOperatorRedrivesAndResolvesThroughABrowser$$' ./console/

# soak-cluster: the soak on the topology of scripts/cluster.sh, with
# synchronous replication: beside SIGKILLed workers and closed connections it
# kills RabbitMQ nodes (kill -9, started again), freezes them (kill -STOP,
# thawed 5 s later) and fails the PostgreSQL
# primary over (the old one rejoins as a standby), then checks the
# invariants, on every example and the liveness worker.
# Like cluster-test, it starts the topology and removes it afterwards, pass
# or fail. Not part of `make test`: a few minutes more.
soak-cluster:
	status=0; \
	urls=$$(./scripts/cluster.sh up --sync) && eval "$$urls" && \
	IDEM_AMQP_URL="$$IDEM_CLUSTER_AMQP_URLS" IDEM_STREAM_URL="$$IDEM_CLUSTER_STREAM_URLS" IDEM_PG_URL="$$IDEM_CLUSTER_PG_URL" \
		$(GO) run ./internal/testkit/soak -n 2000 -rate 60 -fault-every 4s -duration-cap 3m \
		-faults node,freeze,pgfailover,kill,connections || status=$$?; \
	./scripts/cluster.sh down; \
	exit $$status

vet:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags cluster ./...
	$(GO) vet -tags scale ./...

# bench: every figure of BENCHMARKS.md, each against its same-run baseline
# (the large soak is `go run ./internal/testkit/soak` with the flags it gives).
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
	$(GO) test -run '^$$' -bench InboxWALByIDKind -benchtime 300x ./inbox/
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

# path: the files one new queue message and one stream record enter on their
# way, in order, and how often each (bench/path, from calls recorded in an
# instrumented build); it writes the report to bench/path/testdata/path.txt
# and fails when a file of the runtime is entered more than twice, when a
# path runs through more than ten, or when internal/engine's package doc
# numbers other files.
path: services
	$(GO) run ./bench/path -go $(GO) -golden bench/path/testdata/path.txt

# fuzz: every Fuzz target of the module for FUZZ_TIME each (go test -fuzz
# takes one package and one target at a time), after its seed corpus (its
# f.Add values and testdata/fuzz/FuzzName/, which make test runs as tests).
# A failing input is saved under the package's testdata/fuzz/FuzzName/:
# commit it with the fix, as a regression case. A run that ends in "context
# deadline exceeded" with no input saved, and whose corpus then passes, is
# the race of Go's fuzzing coordinator at the end of -fuzztime
# (go.dev/issue/75804, fixed in Go 1.27), not a finding: it is reported and
# skipped. FUZZ_RUN narrows the targets, as a regexp of their names.
FUZZ_TIME ?= 10s
FUZZ_RUN ?= .
FUZZ_FILES = $(shell grep -rlE --include='*_test.go' '^func Fuzz' . | xargs grep -L '^//go:build')
FUZZ_TARGETS = $(sort $(shell grep -HoE '^func Fuzz[A-Za-z0-9_]+' $(FUZZ_FILES) | sed -E 's|^(.*)/[^/]*:func |\1:|'))

fuzz:
	@n=0; raced=0; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}/; target=$${t##*:}; \
		echo "$$target" | grep -qE '$(FUZZ_RUN)' || continue; \
		corpus=$${t%%:*}/testdata/fuzz/$$target; before=$$(ls $$corpus 2>/dev/null); \
		echo "fuzz: $$pkg $$target for $(FUZZ_TIME)"; n=$$((n+1)); \
		out=$$($(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZ_TIME) $$pkg 2>&1) && continue; \
		if [ "$$before" = "$$(ls $$corpus 2>/dev/null)" ] && echo "$$out" | grep -q 'context deadline exceeded' && \
			$(GO) test -count=1 -run "^$$target\$$" $$pkg >/dev/null 2>&1; then \
			echo "fuzz: $$target: no failing input; the coordinator's deadline race (go.dev/issue/75804)"; raced=$$((raced+1)); continue; \
		fi; \
		echo "$$out" | grep -v '^fuzz: elapsed' >&2; \
		echo "fuzz: $$target failed: the input is in $$corpus/; fix it and commit the input" >&2; exit 1; \
	done; \
	[ $$n -gt 0 ] || { echo "fuzz: no target matches FUZZ_RUN=$(FUZZ_RUN)" >&2; exit 1; }; \
	echo "fuzz: $$n targets passed, $(FUZZ_TIME) each ($$raced stopped by the deadline race)"
