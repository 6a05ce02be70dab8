# Shared by bench.sh and soak.sh: build the binaries, run ratelimitd on a
# free loopback port with a throw-away SQLite database, talk to its API, and
# drive it with wrk. Sourced, not run. Every process started here is
# stopped by cleanup, which the caller installs as an EXIT trap.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlbench.XXXXXX")
SVC_PID=
SVC_URL=
SVC_OUT=
SVC_PIDS=
LOAD_PID=
CEILING_PID=
CEILING_PIDS=
# Other processes a caller starts, which cleanup stops as well.
EXTRA_PIDS=
REDIS_PID=
REDIS_PREFIX_IN_USE=
REDIS_URL_IN_USE=
BOOTSTRAP=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# build writes bin/ratelimitd (as `make build` does) and bin/ceiling.
build() {
	(cd "$ROOT" && CGO_ENABLED=0 "${GO:-go}" build -trimpath -o bin/ratelimitd ./cmd/ratelimitd &&
		CGO_ENABLED=0 "${GO:-go}" build -trimpath -o bin/ceiling ./scripts/ceiling) || die "build failed"
}

# need_wrk stops the script, saying how to install wrk, when it is missing.
need_wrk() {
	command -v wrk >/dev/null ||
		die "wrk is needed: install it with 'apt-get install wrk' (Debian, Ubuntu) or 'brew install wrk' (macOS)"
}

# start_ceiling [FLAG...] runs bin/ceiling with the flags given on a free
# loopback port and sets CEILING_PID and CEILING_URL; several ceilings can
# run at once.
start_ceiling() {
	local out="$WORK/ceiling.$$.$RANDOM"
	"$ROOT/bin/ceiling" "$@" >"$out.stdout" 2>"$out.log" &
	CEILING_PID=$!
	CEILING_PIDS="$CEILING_PIDS $CEILING_PID"
	local i
	for i in $(seq 100); do
		CEILING_URL=$(sed -n 's|^ceiling listening on \([a-z]*://[^ ]*\)$|\1|p' "$out.stdout" 2>/dev/null || true)
		[ -n "$CEILING_URL" ] && return 0
		kill -0 "$CEILING_PID" 2>/dev/null || { cat "$out.log" >&2; die "ceiling did not start"; }
		sleep 0.1
	done
	die "ceiling did not listen within 10s"
}

# wrk_spend URL TOKEN DURATION BUCKETS KIND IDS EXPECT runs wrk with
# scripts/spend.lua (which says what the arguments mean) over WRK_THREADS
# threads and WRK_CONNECTIONS connections, and prints its result line:
# "requests seconds p50_us p99_us non2xx wrong socket_errors kinds". An
# answer slower than 10 s is a socket error (a timeout).
wrk_spend() {
	local out
	out=$(wrk -t "$WRK_THREADS" -c "$WRK_CONNECTIONS" -d "$3" --timeout 10s -H "Authorization: Bearer $2" \
		-s "$ROOT/scripts/spend.lua" "$1/v1/spend" -- "$4" "$5" "$6" "$7" "$WRK_THREADS") || die "wrk failed: $out"
	awk '$1 == "result" {$1 = ""; print substr($0, 2); found = 1} END {exit !found}' <<<"$out" ||
		die "wrk printed no result: $out"
}

# machine prints the machine a figure was measured on.
machine() {
	local cpu
	cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null)
	echo "machine: $(nproc) CPUs, ${cpu:-unknown CPU}, $(uname -sr), $("${GO:-go}" version | awk '{print $3}')"
}

# start_service [VAR=value...] runs bin/ratelimitd serve on a free loopback
# port with a database in $WORK, the extra settings given (a later setting
# wins), and waits until /readyz answers 200. It sets SVC_PID, SVC_URL
# and SVC_OUT (its .stdout and .log files without the suffix); several
# services can run at once.
start_service() {
	local out="$WORK/serve.$$.$RANDOM"
	SVC_OUT=$out
	env RATELIMIT_HTTP_ADDR=127.0.0.1:0 \
		RATELIMIT_GRPC_ADDR=127.0.0.1:0 \
		RATELIMIT_DATABASE_URL="sqlite:$WORK/ratelimitd.db" \
		RATELIMIT_BOOTSTRAP_TOKEN="$BOOTSTRAP" \
		RATELIMIT_LOG_LEVEL=warn \
		"$@" "$ROOT/bin/ratelimitd" serve >"$out.stdout" 2>"$out.log" &
	SVC_PID=$!
	SVC_PIDS="$SVC_PIDS $SVC_PID"
	local i addr=
	for i in $(seq 100); do
		addr=$(sed -n 's|^ratelimitd listening on http://\([^ ]*\) .*|\1|p' "$out.stdout" 2>/dev/null || true)
		[ -n "$addr" ] && break
		kill -0 "$SVC_PID" 2>/dev/null || { cat "$out.log" >&2; die "ratelimitd did not start"; }
		sleep 0.1
	done
	[ -n "$addr" ] || die "ratelimitd did not listen within 10s"
	SVC_URL="http://$addr"
	for i in $(seq 100); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$SVC_URL/readyz")" = 200 ] && return 0
		sleep 0.1
	done
	cat "$out.log" >&2
	die "ratelimitd at $SVC_URL not ready within 10s"
}

# stop_services stops every service this script started and waits for
# them.
stop_services() {
	local pid
	for pid in $SVC_PIDS; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	SVC_PIDS=
}

# api METHOD PATH [BODY] calls the API as the bootstrap admin and prints the
# answer; a status other than 2xx is fatal.
api() {
	local out status
	out=$(curl -s -w '\n%{http_code}' -X "$1" -H "Authorization: Bearer $BOOTSTRAP" \
		-H 'Content-Type: application/json' ${3:+--data-binary "$3"} "$SVC_URL$2") || die "$1 $2 failed"
	status=${out##*$'\n'}
	case "$status" in 2??) ;; *) die "$1 $2: $status ${out%$'\n'*}" ;; esac
	printf '%s\n' "${out%$'\n'*}"
}

# put_limit NAME ID_FORMAT BURST COUNT PERIOD creates or updates a limit.
put_limit() {
	api PUT "/v1/limits/$1" "{\"id_format\":\"$2\",\"burst\":$3,\"count\":$4,\"period\":\"$5\"}" >/dev/null
}

# decide_token prints the secret of a new token of scope decide, the scope
# a service asking for decisions has.
decide_token() {
	api POST /v1/tokens "{\"name\":\"load-$RANDOM\",\"scope\":\"decide\"}" | jq -r .token
}

# wait_decides LIMIT ID waits until a check on the limit answers 200: the
# loader has put it in the snapshot.
wait_decides() {
	local i
	for i in $(seq 100); do
		curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $BOOTSTRAP" -H 'Content-Type: application/json' \
			--data-binary "{\"buckets\":[{\"limit\":\"$1\",\"bucket_id\":\"$2\",\"cost\":0}]}" "$SVC_URL/v1/check" |
			grep -q 200 && return 0
		sleep 0.1
	done
	die "limit $1 not in the snapshot within 10s"
}

# metric NAME prints the value of an unlabelled metric from /metrics.
metric() {
	curl -s "$SVC_URL/metrics" | awk -v n="$1" '$1 == n && !done {printf "%.0f\n", $2; done = 1}'
}

# cpu_ticks PID prints the user+system CPU time of a process in clock ticks.
cpu_ticks() {
	awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

# start_redis runs a private redis-server, persistence off, on a free
# loopback port and sets REDIS_PRIVATE_URL. A port found taken is retried.
start_redis() {
	local try port i
	for try in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 40000))
		redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
			--dir "$WORK" --logfile "$WORK/redis.log" &
		REDIS_PID=$!
		for i in $(seq 50); do
			kill -0 "$REDIS_PID" 2>/dev/null || break
			if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
				REDIS_PRIVATE_URL="redis://127.0.0.1:$port"
				return 0
			fi
			sleep 0.1
		done
		kill "$REDIS_PID" 2>/dev/null || true
		wait "$REDIS_PID" 2>/dev/null || true
		REDIS_PID=
	done
	cat "$WORK/redis.log" >&2
	die "redis-server did not start"
}

# redis_up URL reports whether a Redis server answers at URL.
redis_up() {
	command -v redis-cli >/dev/null && [ "$(redis-cli -u "$1" ping 2>/dev/null)" = PONG ]
}

# redis_cleanup deletes the keys under the prefix this script used.
redis_cleanup() {
	if [ -n "$REDIS_PREFIX_IN_USE" ] && command -v redis-cli >/dev/null; then
		redis-cli -u "$REDIS_URL_IN_USE" --scan --pattern "${REDIS_PREFIX_IN_USE}*" 2>/dev/null |
			xargs -r -n 500 redis-cli -u "$REDIS_URL_IN_USE" del >/dev/null 2>&1 || true
		REDIS_PREFIX_IN_USE=
	fi
}

# cleanup stops every process started here, removes WORK, and exits with
# the status given, or else with the status the script is exiting with.
cleanup() {
	local rc=${1:-$?}
	local pid
	for pid in $LOAD_PID $CEILING_PIDS $EXTRA_PIDS; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	stop_services
	redis_cleanup
	if [ -n "$REDIS_PID" ]; then
		kill "$REDIS_PID" 2>/dev/null || true
		wait "$REDIS_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
	exit "$rc"
}

command -v curl >/dev/null || die "curl is needed"
command -v jq >/dev/null || die "jq is needed"
