# The README's two commands are `make run` and `make test`.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build run test check lint bench microbench soak fuzz generate

# The repository holds two modules: the service's, here, and the Go
# client's, in client/, which services require without the service's
# dependencies. `go test ./...` does not descend into a nested module,
# so the targets below run the client's with `go -C client`.

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/ratelimitd ./cmd/ratelimitd

run: build
	./bin/ratelimitd serve

# The whole suite. Tests that need Postgres, Redis or Chromium skip when
# those are missing, and so does the lint without Redocly CLI, except under
# CI=true, where anything missing fails.
test: lint
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) -C client test -race -count=1 -timeout 10m ./...

# Lints openapi.yaml with Redocly CLI's recommended rules (redocly-lint.yaml,
# given with --config, so that other tools built on Redocly's library, such
# as openapi-typescript, never load it; the exceptions and their reasons are
# in .redocly.lint-ignore.yaml beside it).
# `npm ci` installs the version pinned in package-lock.json.
REDOCLY = node_modules/.bin/redocly
lint:
	@if [ -x $(REDOCLY) ]; then $(REDOCLY) lint --config redocly-lint.yaml --format=stylish openapi.yaml; \
	elif [ "$$CI" = true ]; then echo "lint: Redocly CLI is not installed; run npm ci (needs Node.js 20)" >&2; exit 1; \
	else echo "lint: skipped, Redocly CLI is not installed (npm ci installs it)"; fi

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C client vet ./...
	$(STATICCHECK) ./...
	cd client && $(STATICCHECK) ./...
	$(MAKE) test

# Closed-loop throughput of the service over loopback with wrk, as ratios
# to a bare net/http server run alongside (scripts/bench.sh says how; needs
# wrk, curl and jq; BENCH_DURATION, BENCH_ROUNDS and others shorten it).
bench:
	scripts/bench.sh

# Every Go benchmark: the decision path, the stores, the handlers, the
# database and the loader (those need Postgres and Redis; several minutes).
microbench:
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1,2 -timeout 60m ./...
	$(GO) -C client test -run '^$$' -bench . -benchmem -cpu 1,2 -timeout 20m ./...

# Ten minutes at a constant half of the maximum throughput with vegeta;
# memory and goroutines must stay flat (scripts/soak.sh; needs curl, jq and
# bc, and wrk unless SOAK_RATE is set). Not part of the test suite.
soak:
	scripts/soak.sh

# Each fuzzer for FUZZTIME (default 1m), then the model-based test for
# FUZZTIME per engine pair. Findings land in the package's testdata/fuzz,
# to be committed with their fix; the model-based test prints its seed.
FUZZTIME ?= 1m
FUZZERS = ./limiter/bucketid:FuzzCanonical ./limiter:FuzzGCRA ./limitfile:FuzzParse ./limitfile:FuzzRoundTrip ./api/rls:FuzzTranslate \
	./api:FuzzDecisionHandlers ./api:FuzzAdminDecoder ./api/decide:FuzzDecisionDecoder ./api/decide:FuzzManyDecoder ./api/decide:FuzzDecisionJSON \
	./api/forwardauth:FuzzCall
fuzz:
	@for f in $(FUZZERS); do \
		pkg=$${f%%:*}; name=$${f##*:}; \
		echo "== $$name ($$pkg)"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) || exit 1; \
	done
	$(GO) -C client test ./ratelimit -run '^$$' -fuzz '^FuzzDecodeAnswer$$' -fuzztime $(FUZZTIME)
	RATELIMIT_MODEL_DURATION=$(FUZZTIME) $(GO) test ./cmd/ratelimitd -run '^TestModel$$' -count=1 -timeout 0 -v

# Regenerates the Go client from openapi.yaml with the root module's
# oapi-codegen (client/generate.go); a test fails while it is stale.
generate:
	$(GO) -C client generate .
