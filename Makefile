# The README's two commands are `make run` and `make test`.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build run test check bench microbench soak fuzz generate

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/ratelimitd ./cmd/ratelimitd

run: build
	./bin/ratelimitd serve

# The whole suite. Tests that need Postgres, Redis or Chromium skip when
# those are missing, except under CI=true, where a missing service fails.
test:
	$(GO) test -race -count=1 -timeout 20m ./...

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(MAKE) test

# Loads the running service over loopback and prints requests/s and
# latencies (scripts/bench.sh says how; needs curl, jq and bc).
bench:
	scripts/bench.sh

# Every Go benchmark: the decision path, the stores, the handlers, the
# database and the loader (those need Postgres and Redis; several minutes).
microbench:
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1,2 -timeout 60m ./...

# Ten minutes at half the maximum throughput; memory and goroutines must
# stay flat (scripts/soak.sh). Not part of the test suite.
soak:
	scripts/soak.sh

# Each fuzzer for FUZZTIME (default 1m). Findings land in the package's
# testdata/fuzz, to be committed with their fix.
FUZZTIME ?= 1m
FUZZERS = ./limiter:FuzzCanonical ./limiter:FuzzGCRA ./limitfile:FuzzParse ./limitfile:FuzzRoundTrip ./api/rls:FuzzTranslate \
	./api:FuzzDecisionHandlers ./api:FuzzDecisionDecoder ./api:FuzzDecisionJSON ./cmd/loadgen:FuzzResponseReader
fuzz:
	@for f in $(FUZZERS); do \
		pkg=$${f%%:*}; name=$${f##*:}; \
		echo "== $$name ($$pkg)"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

# Regenerates the Go client from openapi.yaml; a test fails while it is stale.
generate:
	$(GO) generate ./client
