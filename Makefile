# The two commands a new user needs: `make demo` and `make test`.
# Both start PostgreSQL and RabbitMQ first (scripts/services.sh).

GO ?= go
TEST_TIMEOUT ?= 25m

.PHONY: demo demo-quickstart demo-payments test soak services vet bench

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
# terminated sessions, a dispatcher killed mid-call, a faulty gateway), then
# the invariants. Needs rabbitmqctl and ss on this machine, as root.
soak: services
	$(GO) run ./examples/soak -n 2000 -rate 60 -fault-every 4s -duration-cap 2m

services:
	./scripts/services.sh

vet:
	$(GO) vet ./...

bench: services
	$(GO) test -run '^$$' -bench . -benchtime 3s ./...
