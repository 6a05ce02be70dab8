# The README's two commands are `make run` and `make test`.
GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build run test check bench fuzz generate soak

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

bench:
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1,2 ./limiter/...

# Each fuzzer for FUZZTIME (default 1m).
FUZZTIME ?= 1m
fuzz:
	$(GO) test ./limiter -run '^$$' -fuzz '^FuzzCanonical$$' -fuzztime $(FUZZTIME)
	$(GO) test ./limiter -run '^$$' -fuzz '^FuzzGCRA$$' -fuzztime $(FUZZTIME)
