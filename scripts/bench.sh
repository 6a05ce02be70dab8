#!/usr/bin/env bash
# bench.sh, run by `make bench`: closed-loop throughput of ratelimitd over
# loopback, measured with wrk against a bare net/http server (bin/ceiling,
# scripts/ceiling) that answers any POST with a fixed 150-byte JSON body:
# no HTTP JSON service on this machine can be faster, so each target is
# reported as a ratio to it, which says more than requests/s on a machine
# whose speed nobody else shares.
#
# A second yardstick, "ceiling waiting", is the same server with -wait
# BENCH_CEILING_WAIT: each handler reads the body to its end and then waits
# for another goroutine, which answers the handlers waiting together once
# per wait, as a store's round trip answers its calls. Its CPU per request
# above the ceiling's is what net/http and the scheduler charge a handler
# that waits, whatever it waits for: the floor under the Redis rows' cost
# above the in-process rows'.
#
# The ceilings and one service per store run at once, each on a free
# loopback port with its own throw-away SQLite database; the load uses a
# token of scope decide, as a client service would. Each round runs every
# target once, one after the other (the ceiling first), so that a
# disturbance of the machine falls on a round, not on a target; the table
# shows the median of the rounds, each column taken on its own.
#
# Two sets of limits:
#
#   bench_allowed_*  burst 1e9 at 1e6/s: every spend is allowed.
#   bench_denied_*   burst 1 at 1 per 24h: each bucket is spent once when
#                    the service starts, a hundred a request; from then on
#                    every spend is denied, after the warm-up by the local
#                    denied cache without a store call.
#
# One-bucket runs spend on bench_*_one (reg_id); three-bucket runs on
# bench_*_reg, bench_*_ip and bench_*_domain, so that a one-bucket run has
# not already emptied a bucket of a three-bucket one. scripts/spend.lua
# makes the bodies, stepping through BENCH_IDS bucket ids per limit, and
# counts answers that are not 2xx or whose "allowed" is wrong. On Redis the
# keys get a random prefix, deleted at the end.
#
# The redis runs use a redis-server of their own on a free loopback port,
# with persistence off, unless BENCH_REDIS_URL names another: then other
# clients of that Redis take part in its CPU figures.
#
# Columns: decisions/s (see below), wrk's p50 and p99 latency, the ratio
# of decisions/s to the ceiling's requests/s, the CPU time the serving
# process used per decision over
# the measured run (utime+stime from /proc), and on Redis the CPU time
# Redis spent per script call (the usec and calls of EVALSHA, EVAL and
# FCALL in INFO commandstats, over the run) and the script calls per
# decision, which is above 1 when another client of the same Redis called
# scripts meanwhile, and denied-cache hits per decision (from /metrics).
# With a private redis-server, two more: the CPU time the whole Redis
# process used per decision (utime+stime from /proc, so reading and writing
# the sockets included), and the script calls per socket read Redis made
# (total_reads_processed of INFO stats): about the script calls per round
# trip. Each median comes with the minimum and maximum of the rounds in
# brackets, and the ratio is the median of each round's ratio to the
# ceiling of the same round. Below the medians, every round's row shows the
# spread.
#
# Two more scenarios take other ways in, on the same store and in the same
# rounds:
#
#   grpc  Envoy's ShouldRateLimit on the service's gRPC listener, driven
#         by h2load as what a gRPC call is on the wire: a POST of a
#         length-prefixed protobuf message over HTTP/2 without TLS, over
#         BENCH_GRPC_CONNECTIONS connections of BENCH_GRPC_STREAMS streams
#         each, as Envoy multiplexes its calls. Its one body asks domain
#         "bench" with one descriptor entry reg_id = 1, which the rule the
#         script creates maps onto bench_allowed_one. h2load reads neither
#         the answers nor the trailers that carry a call's gRPC status, so
#         the service's own count of its allowed gRPC decisions must grow
#         by at least the calls h2load saw answered: a shortfall is a call
#         that failed or was not allowed. (It may grow by more: the calls
#         in flight when h2load stops are decided but not counted by it, so
#         as many failures as there are streams could hide behind them.)
#         (A Go client such as ghz takes
#         most of the two cores itself at a third of this rate, which left
#         the service half idle and measured its wake-ups.)
#   ghz   ShouldRateLimit as Envoy calls it: a new descriptor value per
#         call (reg_id 1 .. BENCH_IDS, the buckets of the one-bucket REST
#         runs), over BENCH_GHZ_CONNECTIONS connections with
#         BENCH_GHZ_CONCURRENCY calls in flight, driven by ghz (pinned,
#         built with go install), which reads every answer. Its calls are
#         count-prefixed binary messages, parsed once and sent in turn, so
#         that ghz spends no CPU on templates. ghz takes a share of the two
#         cores itself, so its req/s are not comparable with wrk's; the
#         service's CPU per call is. As for grpc, the service's count of
#         its allowed gRPC decisions must grow by the calls ghz saw OK.
#         With ghz comes one more yardstick, "grpc ceiling": the same ghz
#         load on a bare grpc-go server with the service's listener
#         settings (scripts/ceiling -grpc), which answers every call OK
#         without reading it. Its CPU per call is what grpc-go charges any
#         call: the floor under the ghz rows, as the ceiling is under wrk's.
#   fa    a gateway's forward auth, GET /v1/forward-auth/bench?d=remote_address
#         with a new client address per call in X-Forwarded-For from a
#         trusted hop (wrk on loopback), as nginx sends it
#         (scripts/forwardauth.lua), through a rule onto bench_allowed_ip.
#   ip-allowed  the REST spend of the same buckets: one bucket of
#         bench_allowed_ip a request, the same addresses in turn.
#   h2c   the REST spend over HTTP/2 without TLS (prior knowledge), driven
#         by h2load (Debian's nghttp2-client package) over
#         BENCH_H2C_CONNECTIONS connections of BENCH_H2C_STREAMS streams
#         each. h2load sends one body, so every request spends on the same
#         bucket of bench_allowed_one; it reports no percentiles (p50 and
#         p99 show -), and it does not read the answers either.
#
# Their ratio to the ceiling compares them with HTTP/1.1 over wrk: the
# ceiling speaks only that.
#
#   decisions  many decisions in one request: wrk posts /v1/decisions with
#         scripts/decisions.lua over BENCH_DECISIONS_CONNECTIONS
#         connections, BENCH_DECISIONS spends of one bucket each of
#         bench_allowed_one a request, the bucket ids stepping through
#         BENCH_IDS so that every request names new ones, as a client that
#         gathers the calls of its callers sends them. Every result must
#         say allowed, and not degraded. Fewer connections than the other
#         rows: each carries BENCH_DECISIONS decisions, and a client that
#         gathers its callers' calls keeps few requests in flight.
#
# Two more, driven by a Go program, scripts/clientload, as a service calls
# ratelimitd: BENCH_CLIENT_GOROUTINES goroutines in a closed loop, each
# call a spend of one token on bench_allowed_one, the ids stepping through
# BENCH_IDS as spend.lua's do, every answer checked:
#
#   client       through the Go package for services (client/ratelimit),
#                whose calls share requests to POST /v1/decisions. Local
#                denials are off (no call here is denied anyway).
#   client-rest  each call a POST /v1/spend through the generated client
#                (package client): what a service pays without the
#                package, and the yardstick of the client's own CPU.
#
# A table of their own adds what only they measure: the CPU the client
# process used per decision (getrusage), the mean decisions per HTTP
# request, and the ratio of decisions/s to the requests/s of the same
# store's 1-allowed row (the REST spend over wrk) in the same round.
#
# A decision is one request of a single route, or one request of a
# /v1/decisions body: the rates and CPU columns are per decision, which for
# every row but decisions and client is per HTTP request; p50 and p99 are
# per HTTP request, but in the client rows, where they are per call.
#
# The scenario "nginx" has a table of its own, after this one: requests
# through nginx alone, with its limit_req, and asking ratelimitd with
# auth_request from deploy/gateways (scripts/bench-nginx.sh says how).
#
# One more store, not among the defaults: replicated, a private primary
# and its replica (persistence off), with two services on them in the same
# rounds, "replicated" as the redis store runs and "replicated-wait" with
# RATELIMIT_REDIS_WAIT_REPLICAS=1, whose writes that take wait for the
# replica's acknowledgement (one WAIT per round trip): their difference is
# what the acknowledgement costs. Their Redis CPU column is the primary's
# and the replica's together.
#
#   BENCH_DURATION     measured time per run                 10s
#   BENCH_WARMUP       unmeasured load before each run        2s
#   BENCH_THREADS      wrk threads                            2
#   BENCH_CONNECTIONS  keep-alive connections                 64
#   BENCH_IDS          bucket ids per limit (<= 65535)        10000
#   BENCH_ROUNDS       rounds; the table shows their median   3
#   BENCH_STORES       which stores                           "memory redis"
#                      (also replicated)
#   BENCH_SCENARIOS    which runs per store                   "1-allowed 3-allowed 1-denied grpc ghz h2c ip-allowed fa nginx
#                      (also 3-denied)                        decisions client client-rest"
#   BENCH_DECISIONS    spends per request (decisions)         64
#   BENCH_DECISIONS_CONNECTIONS  wrk connections (decisions)  8
#   BENCH_GRPC_CONNECTIONS  h2load connections (grpc)         2
#   BENCH_GRPC_STREAMS      h2load streams per connection     32
#   BENCH_GHZ_CONNECTIONS   ghz connections (ghz)             1
#   BENCH_GHZ_CONCURRENCY   ghz calls in flight (ghz)         32
#   BENCH_H2C_CONNECTIONS   h2load connections (h2c)          2
#   BENCH_H2C_STREAMS       h2load streams per connection     32
#   BENCH_CEILING_WAIT the waiting ceiling's wait; 0 leaves   200us
#                      it out
#   BENCH_CLIENT_GOROUTINES  clientload's goroutines          64
#                      (client, client-rest)
#   BENCH_REDIS_URL    Redis for the redis runs               a private redis-server
#   BENCH_GOGC         GOGC of the service                    unset: the service's
#                      floor of 64 MiB between collections (docs/configuration.md)
#
# The exit status is 1 when a run counted an error: a non-2xx answer (or
# gRPC status other than OK), an answer that did not say allowed (or
# denied) as it should, or a socket error.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
WRK_THREADS=${BENCH_THREADS:-2}
WRK_CONNECTIONS=${BENCH_CONNECTIONS:-64}
IDS=${BENCH_IDS:-10000}
ROUNDS=${BENCH_ROUNDS:-3}
STORES=${BENCH_STORES:-memory redis}
SCENARIOS=${BENCH_SCENARIOS:-1-allowed 3-allowed 1-denied grpc ghz h2c ip-allowed fa nginx decisions client client-rest}
PER=${BENCH_DECISIONS:-64}
PER_CONNECTIONS=${BENCH_DECISIONS_CONNECTIONS:-8}
REDIS_URL=${BENCH_REDIS_URL:-}
GRPC_CONNECTIONS=${BENCH_GRPC_CONNECTIONS:-2}
GRPC_STREAMS=${BENCH_GRPC_STREAMS:-32}
GHZ_CONNECTIONS=${BENCH_GHZ_CONNECTIONS:-1}
GHZ_CONCURRENCY=${BENCH_GHZ_CONCURRENCY:-32}
GHZ=github.com/bojand/ghz/cmd/ghz@v0.121.0
H2C_CONNECTIONS=${BENCH_H2C_CONNECTIONS:-2}
H2C_STREAMS=${BENCH_H2C_STREAMS:-32}
CEILING_WAIT=${BENCH_CEILING_WAIT:-200us}
CLIENT_GOROUTINES=${BENCH_CLIENT_GOROUTINES:-64}
[ "$IDS" -ge 1 ] && [ "$IDS" -le 65535 ] || die "BENCH_IDS must be 1 to 65535 (ids become IPv6 groups)"
[ "$ROUNDS" -ge 1 ] || die "BENCH_ROUNDS must be at least 1"
for sc in $SCENARIOS; do
	case $sc in 1-allowed | 3-allowed | 1-denied | 3-denied | grpc | ghz | h2c | ip-allowed | fa | nginx | decisions | client | client-rest) ;; *) die "unknown scenario $sc in BENCH_SCENARIOS" ;; esac
done
[[ $PER =~ ^[1-9][0-9]*$ ]] && [ "$PER" -le 1000 ] || die "BENCH_DECISIONS must be 1 to 1000"
[[ $PER_CONNECTIONS =~ ^[1-9][0-9]*$ ]] || die "BENCH_DECISIONS_CONNECTIONS must be a positive integer"
for n in "$GRPC_CONNECTIONS" "$GRPC_STREAMS" "$GHZ_CONNECTIONS" "$GHZ_CONCURRENCY" "$H2C_CONNECTIONS" "$H2C_STREAMS" "$CLIENT_GOROUTINES"; do
	[[ $n =~ ^[1-9][0-9]*$ ]] || die "BENCH_GRPC_CONNECTIONS, BENCH_GRPC_STREAMS, BENCH_GHZ_CONNECTIONS, BENCH_GHZ_CONCURRENCY, BENCH_H2C_CONNECTIONS, BENCH_H2C_STREAMS and BENCH_CLIENT_GOROUTINES must be positive integers"
done

# has_scenario NAME reports whether BENCH_SCENARIOS names a scenario.
has_scenario() {
	case " $SCENARIOS " in *" $1 "*) return 0 ;; esac
	return 1
}

need_wrk
build
if has_scenario client || has_scenario client-rest; then
	(cd "$ROOT" && CGO_ENABLED=0 "${GO:-go}" build -trimpath -o bin/clientload ./scripts/clientload) || die "building clientload failed"
fi
# The nginx scenario runs after the others' table, from its own file.
NGINX=
if has_scenario nginx; then
	command -v nginx >/dev/null && command -v envsubst >/dev/null ||
		die "nginx and envsubst are needed for the nginx runs: install them with 'apt-get install nginx gettext-base' (Debian, Ubuntu), or leave nginx out of BENCH_SCENARIOS"
	NGINX=1
	SCENARIOS=$(sed 's/\(^\| \)nginx\( \|$\)/ /' <<<"$SCENARIOS")
fi
if { has_scenario h2c || has_scenario grpc; } && ! command -v h2load >/dev/null; then
	die "h2load is needed for the h2c and grpc runs: install it with 'apt-get install nghttp2-client' (Debian, Ubuntu) or 'brew install nghttp2' (macOS), or leave them out of BENCH_SCENARIOS"
fi
printf '{"buckets":[{"limit":"bench_allowed_one","bucket_id":"1"}]}' >"$WORK/h2c-body.json"
# The grpc runs' call: no compression, 22 bytes of RateLimitRequest
# {domain: "bench", descriptors: [{entries: [{key: "reg_id", value: "1"}]}]}
# (field 1, "bench"; field 2, a descriptor of 13 bytes: its field 1, an
# entry of 11 bytes: key "reg_id", value "1").
printf '\x00\x00\x00\x00\x16\x0a\x05bench\x12\x0d\x0a\x0b\x0a\x06reg_id\x12\x011' >"$WORK/grpc-body.bin"
if has_scenario ghz; then
	GOBIN="$WORK" "${GO:-go}" install "$GHZ" || die "go install $GHZ failed"
	# The ghz runs' calls: the body above with reg_id 1 .. BENCH_IDS, each
	# prefixed by its length (a varint of one byte: every call is short).
	for ((i = 1; i <= IDS; i++)); do
		printf "$(printf '\\x%02x\\x0a\\x05bench\\x12\\x%02x\\x0a\\x%02x\\x0a\\x06reg_id\\x12\\x%02x' $((21 + ${#i})) $((12 + ${#i})) $((10 + ${#i})) ${#i})%s" "$i"
	done >"$WORK/ghz-calls.bin"
fi
TICK=$(getconf CLK_TCK)
RESULTS="$WORK/results"
: >"$RESULTS"
# The client rows' own figures, a line per run: target, round, client CPU
# µs per decision, decisions per HTTP request, and (filled in below) the
# ratio to the REST spend row.
CLIENT_RESULTS="$WORK/client-results"
: >"$CLIENT_RESULTS"
status=0

# The targets: the ceiling, then each store's scenarios. For each, its
# URL, gRPC address, token, process id and Redis (empty but for the redis
# stores), and the process ids of that Redis when they are not REDIS_PID's.
declare -A URL GRPC TOKEN PID REDIS RPIDS
TARGETS=(ceiling)
start_ceiling
URL[ceiling]=$CEILING_URL GRPC[ceiling]='' TOKEN[ceiling]=none PID[ceiling]=$CEILING_PID REDIS[ceiling]=''
if has_scenario ghz; then
	# The gRPC yardstick (scripts/ceiling -grpc): its CPU per call is
	# grpc-go's own.
	t="grpc ceiling"
	TARGETS+=("$t")
	start_ceiling -grpc
	URL[$t]='' GRPC[$t]=${CEILING_URL#grpc://} TOKEN[$t]=none PID[$t]=$CEILING_PID REDIS[$t]=''
fi
if [ "$CEILING_WAIT" != 0 ]; then
	t="ceiling waiting"
	TARGETS+=("$t")
	start_ceiling -wait "$CEILING_WAIT"
	URL[$t]=$CEILING_URL GRPC[$t]='' TOKEN[$t]=none PID[$t]=$CEILING_PID REDIS[$t]=''
fi

# grpc_addr prints the address of the gRPC listener of the service started
# last, as it announced it.
grpc_addr() {
	local addr
	for _ in $(seq 100); do
		addr=$(sed -n 's|^Envoy rate limit service listening on [a-z]*://\(.*\)$|\1|p' "$SVC_OUT.stdout")
		[ -n "$addr" ] && { echo "$addr"; return 0; }
		sleep 0.1
	done
	die "ratelimitd at $SVC_URL announced no gRPC listener within 10s"
}

# empty_buckets LIMIT... spends once on each of the BENCH_IDS buckets of
# the denied limits named (bench_denied_LIMIT), a hundred buckets a
# request, so that every spend of a denied run is denied however fast the
# warm-up goes. The bucket ids are those scripts/spend.lua makes.
empty_buckets() {
	local limit from
	for limit in "$@"; do
		for ((from = 1; from <= IDS; from += 100)); do
			api POST /v1/spend "$(jq -nc --arg l "$limit" --argjson from $from --argjson to $((from + 99 < IDS ? from + 99 : IDS)) '
				def hex: if . < 16 then "0123456789abcdef"[.:. + 1] else (. / 16 | floor | hex) + (. % 16 | hex) end;
				{buckets: [range($from; $to + 1) | {limit: "bench_denied_\($l)",
					bucket_id: (if $l == "ip" then "2001:db8::\(hex)" elif $l == "domain" then "host\(.).example.com" else tostring end)}]}')" |
				jq -e .allowed >/dev/null || die "emptying bench_denied_$limit from id $from was not allowed"
		done
	done
}

# start_store STORE [VAR=value...] starts the service of a store, gives it
# the bench limits and a decide token, and adds its targets.
start_store() {
	local store=$1 kind fmt sc
	shift
	start_service RATELIMIT_DATABASE_URL="sqlite:$WORK/$store.db" ${BENCH_GOGC:+GOGC=$BENCH_GOGC} "$@"
	for kind in allowed denied; do
		for fmt in one:reg_id reg:reg_id ip:ip_address domain:domain; do
			if [ $kind = allowed ]; then
				put_limit "bench_${kind}_${fmt%%:*}" "${fmt#*:}" 1000000000 1000000 1s
			else
				put_limit "bench_${kind}_${fmt%%:*}" "${fmt#*:}" 1 1 24h
			fi
		done
		# The rules of the grpc, ghz and fa runs come before the last
		# limit, so that the snapshot wait_decides waits for holds them too.
		if [ $kind = allowed ]; then
			api POST /v1/rules '{"domain":"bench","descriptor":[{"key":"reg_id"}],"limit":"bench_allowed_one"}' >/dev/null
			api POST /v1/rules '{"domain":"bench","descriptor":[{"key":"remote_address"}],"limit":"bench_allowed_ip"}' >/dev/null
		fi
	done
	wait_decides bench_denied_domain example.com
	for sc in $SCENARIOS; do
		case $sc in
		1-denied) empty_buckets one ;;
		3-denied) empty_buckets reg ip domain ;;
		esac
	done
	local token grpc
	token=$(decide_token)
	grpc=$(grpc_addr)
	for sc in $SCENARIOS; do
		TARGETS+=("$store $sc")
		URL["$store $sc"]=$SVC_URL GRPC["$store $sc"]=$grpc TOKEN["$store $sc"]=$token PID["$store $sc"]=$SVC_PID REDIS["$store $sc"]=
	done
}

# start_replicated starts the replicated store's primary and replica,
# persistence off, each on a free loopback port, and returns once the
# replica is in sync; it sets REPL_URL and REPL_PIDS. stop_replicated,
# which the EXIT trap runs, stops them.
REPL_PIDS=
start_replicated() {
	local role port pid primary= try i
	# The exit status is kept aside: under set -e a trap stops at its
	# first command that fails, so stop_replicated must not return it.
	trap 'rc=$?; stop_replicated; cleanup "$rc"' EXIT
	for role in primary replica; do
		for try in 1 2 3 4 5; do
			port=$((20000 + RANDOM % 40000))
			redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$WORK" \
				--logfile "$WORK/redis-$role.log" ${primary:+--replicaof 127.0.0.1 "$primary"} &
			pid=$!
			for i in $(seq 50); do
				kill -0 "$pid" 2>/dev/null || break
				[ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break 2
				sleep 0.1
			done
			kill "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
			pid=
		done
		[ -n "$pid" ] || { cat "$WORK/redis-$role.log" >&2; die "the replicated store's $role did not start"; }
		REPL_PIDS="$REPL_PIDS $pid"
		[ -n "$primary" ] || { primary=$port; REPL_URL="redis://127.0.0.1:$port"; }
	done
	for i in $(seq 100); do
		redis-cli -p "$port" info replication | grep -q '^master_link_status:up' && return 0
		sleep 0.1
	done
	die "the replicated store's replica did not sync within 10s"
}

# stop_replicated stops what start_replicated started.
stop_replicated() {
	local pid
	for pid in $REPL_PIDS; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
}

for store in $STORES; do
	case $store in
	memory) start_store memory ;;
	replicated)
		command -v redis-server >/dev/null || die "the replicated store needs redis-server"
		start_replicated
		for t in replicated replicated-wait; do
			wait_setting=
			[ $t = replicated-wait ] && wait_setting=RATELIMIT_REDIS_WAIT_REPLICAS=1
			start_store $t RATELIMIT_REDIS_URL="$REPL_URL" RATELIMIT_REDIS_PREFIX="bench-$t:" $wait_setting
			for sc in $SCENARIOS; do
				[ "${sc#*-}" = denied ] || REDIS["$t $sc"]=$REPL_URL RPIDS["$t $sc"]=$REPL_PIDS
			done
		done
		;;
	redis)
		if [ -z "$REDIS_URL" ] && command -v redis-server >/dev/null; then
			start_redis
			REDIS_URL=$REDIS_PRIVATE_URL
		fi
		if ! redis_up "$REDIS_URL"; then
			echo "bench: no Redis answers at $REDIS_URL (or redis-cli is missing); the redis runs are skipped" >&2
			continue
		fi
		REDIS_URL_IN_USE=$REDIS_URL
		REDIS_PREFIX_IN_USE="bench-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n'):"
		start_store redis RATELIMIT_REDIS_URL="$REDIS_URL" RATELIMIT_REDIS_PREFIX="$REDIS_PREFIX_IN_USE"
		# A denied run makes no script call: whatever Redis counts then is
		# another client's.
		for sc in $SCENARIOS; do [ "${sc#*-}" = denied ] || REDIS["redis $sc"]=$REDIS_URL; done
		;;
	*) die "unknown store $store in BENCH_STORES" ;;
	esac
done

# script_stats URL prints "calls usec reads" of the script commands Redis
# has run and of the socket reads it has made.
script_stats() {
	redis-cli -u "$1" info all | tr -d '\r' |
		awk -F'[:,=]' '$1 ~ /^cmdstat_(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro)$/ {c += $3; u += $5}
			$1 == "total_reads_processed" {r = $2 + 0}
			END {print c + 0, u + 0, r + 0}'
}

# grpc_allowed URL prints how many gRPC spends on bench_allowed_one the
# service at URL has counted as allowed.
grpc_allowed() {
	curl -s "$1/metrics" | awk '/^ratelimitd_decisions_total\{/ && /frontend="grpc"/ && /limit="bench_allowed_one"/ &&
		/op="spend"/ && /result="allowed"/ {n += $2} END {printf "%d\n", n}'
}

# grpc_spend ADDR URL TOKEN DURATION calls ShouldRateLimit at ADDR for
# DURATION (see grpc above), checks the calls against the decisions the
# service at URL counted, and prints a line as wrk_spend does: p50 and p99
# "-", and the calls that the service did not count as allowed as answers
# with the wrong "allowed".
grpc_spend() {
	local out before after threads=$((GRPC_CONNECTIONS < WRK_THREADS ? GRPC_CONNECTIONS : WRK_THREADS))
	before=$(grpc_allowed "$2")
	out=$(h2load -c "$GRPC_CONNECTIONS" -m "$GRPC_STREAMS" -t "$threads" -D "$4" -d "$WORK/grpc-body.bin" \
		-H "authorization: Bearer $3" -H 'content-type: application/grpc' -H 'te: trailers' \
		"http://$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" 2>&1) || die "h2load failed: $out"
	after=$(grpc_allowed "$2")
	h2load_line "$out" $((after - before))
}

# ghz_spend ADDR URL TOKEN DURATION calls ShouldRateLimit at ADDR for
# DURATION with ghz (see ghz above), checks the calls against the
# decisions the service at URL counted (unless URL is empty: the gRPC
# ceiling counts nothing), and prints a line as wrk_spend does.
ghz_spend() {
	local out before=0 after=-1
	[ -z "$2" ] || before=$(grpc_allowed "$2")
	out=$("$WORK/ghz" --insecure --call envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit \
		--binary-file "$WORK/ghz-calls.bin" --connections "$GHZ_CONNECTIONS" --concurrency "$GHZ_CONCURRENCY" \
		--duration "$4" --metadata "{\"authorization\":\"Bearer $3\"}" --format json "$1" 2>&1) || die "ghz failed: $out"
	[ -z "$2" ] || after=$(grpc_allowed "$2")
	# When its time is up, ghz closes the connection under the calls in
	# flight, and counts them as failed: at most one per call in flight
	# is its own cut, not the service's.
	jq -r --argjson allowed $((after - before)) --argjson inflight "$GHZ_CONCURRENCY" '
		(.statusCodeDistribution.OK // 0) as $ok
		| ([(.errorDistribution // {}) | to_entries[] | select(.key | test("closed network connection|transport is closing|code = Canceled")) | .value] | add // 0) as $cut
		| [.count, .total / 1e9,
			(.latencyDistribution // [] | map(select(.percentage == 50))[0].latency // 0) / 1000,
			(.latencyDistribution // [] | map(select(.percentage == 99))[0].latency // 0) / 1000,
			.count - $ok - ([$cut, $inflight] | min), (if $allowed >= 0 and $ok > $allowed then $ok - $allowed else 0 end), 0,
			((.errorDistribution // {}) | to_entries | map("\(.value) \(.key)") | join("; ") | if . == "" then "-" else gsub(" "; "_") end)]
		| map(tostring) | join(" ")' <<<"$out" || die "ghz printed no result: $out"
}

# fa_spend URL TOKEN DURATION makes forward-auth calls with wrk and
# scripts/forwardauth.lua for DURATION, and prints wrk_spend's line.
fa_spend() {
	local out
	out=$(wrk -t "$WRK_THREADS" -c "$WRK_CONNECTIONS" -d "$3" --timeout 10s -s "$ROOT/scripts/forwardauth.lua" \
		"$1/v1/forward-auth/bench" -- "$IDS" "$2" "$WRK_THREADS") || die "wrk failed: $out"
	awk '$1 == "result" {$1 = ""; print substr($0, 2); found = 1} END {exit !found}' <<<"$out" ||
		die "wrk printed no result: $out"
}

# h2load_spend URL TOKEN DURATION spends over h2c for DURATION (see h2c
# above) and prints a line as wrk_spend does, p50 and p99 "-".
h2load_spend() {
	local out threads=$((H2C_CONNECTIONS < WRK_THREADS ? H2C_CONNECTIONS : WRK_THREADS))
	out=$(h2load -c "$H2C_CONNECTIONS" -m "$H2C_STREAMS" -t "$threads" -D "$3" -d "$WORK/h2c-body.json" \
		-H "authorization: Bearer $2" -H 'content-type: application/json' "$1/v1/spend" 2>&1) || die "h2load failed: $out"
	h2load_line "$out" -
}

# h2load_line OUTPUT ALLOWED prints wrk_spend's line for h2load's OUTPUT;
# ALLOWED, unless -, is how many requests the service counted as allowed
# meanwhile, and the answered requests beyond it count as wrong.
h2load_line() {
	awk -v allowed="$2" '$1 == "finished" {secs = $3 + 0}
		$1 == "requests:" {done = $6; failed = $10; errored = $12; timeout = $14}
		$1 == "status" && $2 == "codes:" {ok = $3; other = $5 + $7 + $9}
		END {if (secs == "") exit 1
			wrong = allowed == "-" || allowed >= ok ? 0 : ok - allowed
			print done + 0, secs, "-", "-", other + 0, wrong, errored + timeout, failed ? failed " failed, " errored " errored, " timeout " timed out" : "-"}' <<<"$1" ||
		die "h2load printed no result: $1"
}

# decisions_spend URL TOKEN DURATION posts /v1/decisions for DURATION
# (see decisions above) and prints wrk_spend's line, counting requests.
decisions_spend() {
	local out
	out=$(wrk -t "$WRK_THREADS" -c "$PER_CONNECTIONS" -d "$3" --timeout 10s -H "Authorization: Bearer $2" \
		-s "$ROOT/scripts/decisions.lua" "$1/v1/decisions" -- "$PER" "$IDS" "$WRK_THREADS") || die "wrk failed: $out"
	awk '$1 == "result" {$1 = ""; print substr($0, 2); found = 1} END {exit !found}' <<<"$out" ||
		die "wrk printed no result: $out"
}

# client_spend URL TOKEN DURATION SCENARIO EXPECT runs scripts/clientload
# (see client and client-rest above) and prints wrk_spend's line, its
# errors as non-2xx answers; it leaves the client's CPU µs and the HTTP
# requests it made in $WORK/client-last.
client_spend() {
	local mode=package out calls secs p50 p99 errors wrong cpu requests
	[ "$4" = client-rest ] && mode=rest
	out=$("$ROOT/bin/clientload" -url "$1" -token "$2" -mode "$mode" -duration "$3" -warmup 0s -ids "$IDS" \
		-goroutines "$CLIENT_GOROUTINES" -limit bench_allowed_one -expect "$5" 2>&1) || die "clientload failed: $out"
	read -r _ calls secs p50 p99 errors wrong cpu requests < <(grep '^result ' <<<"$out") || die "clientload printed no result: $out"
	echo "$cpu $requests" >"$WORK/client-last"
	echo "$calls $secs $p50 $p99 $errors $wrong 0 -"
}

# spend TARGET DURATION EXPECT loads a target for DURATION with the
# tool of its scenario and prints wrk_spend's line.
spend() {
	local t=$1 n=1 kind=allowed
	[ "$t" = "grpc ceiling" ] && { ghz_spend "${GRPC[$t]}" "" "" "$2"; return; }
	if [ "${TOKEN[$t]}" != none ]; then
		local sc=${t#* }
		case $sc in
		grpc) grpc_spend "${GRPC[$t]}" "${URL[$t]}" "${TOKEN[$t]}" "$2"; return ;;
		ghz) ghz_spend "${GRPC[$t]}" "${URL[$t]}" "${TOKEN[$t]}" "$2"; return ;;
		fa) fa_spend "${URL[$t]}" "${TOKEN[$t]}" "$2"; return ;;
		h2c) h2load_spend "${URL[$t]}" "${TOKEN[$t]}" "$2"; return ;;
		decisions) decisions_spend "${URL[$t]}" "${TOKEN[$t]}" "$2"; return ;;
		client | client-rest) client_spend "${URL[$t]}" "${TOKEN[$t]}" "$2" "$sc" "$3"; return ;;
		esac
		n=${sc%%-*} kind=${sc#*-}
	fi
	wrk_spend "${URL[$t]}" "${TOKEN[$t]}" "$2" "$n" "$kind" "$IDS" "$3"
}

# run ROUND TARGET warms the target up, then measures it, and appends a
# row to $RESULTS: target, round, decisions/s, p50 ms, p99 ms, service µs
# per decision, Redis µs per script call and script calls per decision (or
# -), denied-cache hits per decision (or -), Redis process µs per decision
# and script calls per socket read (or -, without a private redis-server).
run() {
	local round=$1 t=$2 expect=true
	[ "${t##*-}" = denied ] && expect=false
	local req secs p50 p99 bad wrong sock kinds cpu0 cpu1 c0=0 u0=0 r0=0 c1=0 u1=0 r1=0 hits0=- hits1=- rcpu0=0 rcpu1=0 own= rpid rpids=${RPIDS[$t]:-$REDIS_PID}
	[ -n "${REDIS[$t]}" ] && [ -n "$rpids" ] && own=1
	read -r _ _ _ _ bad wrong sock kinds < <(spend "$t" "$WARMUP" any)
	[ "$bad" = 0 ] && [ "$sock" = 0 ] || { echo "bench: $t, round $round, warm-up: $bad non-2xx, $sock socket errors ($kinds)" >&2; status=1; }
	cpu0=$(cpu_ticks "${PID[$t]}")
	[ -n "${REDIS[$t]}" ] && read -r c0 u0 r0 < <(script_stats "${REDIS[$t]}")
	if [ -n "$own" ]; then for rpid in $rpids; do rcpu0=$((rcpu0 + $(cpu_ticks "$rpid"))); done; fi
	[ "${TOKEN[$t]}" != none ] && SVC_URL=${URL[$t]} hits0=$(metric ratelimitd_denied_cache_hits_total)
	read -r req secs p50 p99 bad wrong sock kinds < <(spend "$t" "$DURATION" "$expect")
	cpu1=$(cpu_ticks "${PID[$t]}")
	[ -n "${REDIS[$t]}" ] && read -r c1 u1 r1 < <(script_stats "${REDIS[$t]}")
	if [ -n "$own" ]; then for rpid in $rpids; do rcpu1=$((rcpu1 + $(cpu_ticks "$rpid"))); done; fi
	[ "${TOKEN[$t]}" != none ] && SVC_URL=${URL[$t]} hits1=$(metric ratelimitd_denied_cache_hits_total)
	if [ "$bad" != 0 ] || [ "$wrong" != 0 ] || [ "$sock" != 0 ]; then
		echo "bench: $t, round $round: $bad non-2xx, $wrong with \"allowed\" not $expect, $sock socket errors ($kinds)" >&2
		status=1
	fi
	# From here on the figures are per decision.
	[ "${t#* }" = decisions ] && req=$((req * PER))
	case ${t#* } in client | client-rest)
		local ccpu creqs
		read -r ccpu creqs <"$WORK/client-last"
		awk -v t="$t" -v r="$round" -v req="$req" -v cpu="$ccpu" -v n="$creqs" \
			'BEGIN {printf "%s\t%d\t%.1f\t%.1f\n", t, r, req ? cpu / req : 0, n ? req / n : 0}' >>"$CLIENT_RESULTS"
		;;
	esac
	awk -v t="$t" -v r="$round" -v req="$req" -v secs="$secs" -v p50="$p50" -v p99="$p99" -v tick="$TICK" \
		-v cpu=$((cpu1 - cpu0)) -v calls=$((c1 - c0)) -v usec=$((u1 - u0)) -v redis="${REDIS[$t]}" -v h0="$hits0" -v h1="$hits1" \
		-v own="$own" -v rcpu=$((rcpu1 - rcpu0)) -v reads=$((r1 - r0)) 'BEGIN {
		printf "%s\t%d\t%.0f\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\n", t, r, req / secs,
			p50 == "-" ? "-" : sprintf("%.2f", p50 / 1000), p99 == "-" ? "-" : sprintf("%.2f", p99 / 1000),
			req ? cpu / tick * 1e6 / req : 0,
			redis == "" ? "-" : (calls ? sprintf("%.1f", usec / calls) : "none"),
			redis == "" ? "-" : sprintf("%.2f", req ? calls / req : 0),
			h0 == "-" ? "-" : sprintf("%.2f", req ? (h1 - h0) / req : 0),
			own == "" ? "-" : sprintf("%.1f", req ? rcpu / tick * 1e6 / req : 0),
			own == "" ? "-" : sprintf("%.2f", reads ? calls / reads : 0)
	}' >>"$RESULTS"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
	echo "bench: round $round of $ROUNDS" >&2
	for t in "${TARGETS[@]}"; do
		run "$round" "$t"
	done
done

# Each row gets a twelfth column: its ratio to the requests/s of the
# ceiling of the same round.
awk -F'\t' -v OFS='\t' '{row[NR] = $0; if ($1 == "ceiling") c[$2] = $3}
	END {for (i = 1; i <= NR; i++) {split(row[i], f, "\t"); printf "%s\t%.2f\n", row[i], c[f[2]] ? f[3] / c[f[2]] : 0}}' \
	"$RESULTS" >"$RESULTS.ratio"
mv "$RESULTS.ratio" "$RESULTS"

# median TARGET COLUMN [FILE] prints the median of a column of $RESULTS
# (or FILE) over the rounds and, with more than one round, their minimum
# and maximum in brackets.
median() {
	awk -F'\t' -v t="$1" -v c="$2" '$1 == t {print $c}' "${3:-$RESULTS}" | sort -g |
		awk '{v[NR] = $1} END {if (v[1] !~ /^[0-9.]+$/) {print v[1]; exit}
			m = NR % 2 ? v[(NR + 1) / 2] : sprintf("%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2)
			print (NR > 1 ? m " (" v[1] "–" v[NR] ")" : m)}'
}

echo
machine
echo "load:    wrk, $WRK_THREADS threads, $WRK_CONNECTIONS keep-alive connections over loopback, ${WARMUP} warm-up then ${DURATION} measured per run, $IDS bucket ids per limit"
has_scenario decisions && echo "decisions: $PER spends of one bucket each per request to /v1/decisions, new bucket ids every request, over $PER_CONNECTIONS connections"
has_scenario grpc && echo "grpc:    $(h2load --version | head -1), $GRPC_CONNECTIONS connections x $GRPC_STREAMS streams, ShouldRateLimit on one bucket (the same id)"
has_scenario ghz && echo "ghz:     ghz ${GHZ#*@}, $GHZ_CONNECTIONS connection(s), $GHZ_CONCURRENCY calls in flight, ShouldRateLimit on bench_allowed_one, a new reg_id per call (1..$IDS)"
has_scenario fa && echo "fa:      wrk and scripts/forwardauth.lua, forward auth with a new client address per call in X-Forwarded-For (2001:db8::1..$IDS), bench_allowed_ip; ip-allowed spends the same buckets over REST"
has_scenario h2c && echo "h2c:     $(h2load --version | head -1), $H2C_CONNECTIONS connections x $H2C_STREAMS streams, one bucket (the same id)"
# Other work on the machine shows in its load average: the bench alone
# keeps at most four processes busy (wrk, the target, Redis, the shell).
echo "load average (1, 5, 15 min): $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after"
echo "service: GOGC=${BENCH_GOGC:-unset (the 64 MiB floor)}, GOMAXPROCS=$(nproc), log level warn; median of $ROUNDS round$([ "$ROUNDS" = 1 ] || echo s)"
[ -n "$REDIS_PID" ] && echo "redis:   a private redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), persistence off"
[ -n "$REDIS_URL" ] && [ -z "$REDIS_PID" ] && echo "redis:   $REDIS_URL, shared with its other clients"
[ -n "$REPL_PIDS" ] && echo "replicated: a private primary and its replica, persistence off; the -wait rows wait for the replica within 50ms"
echo "command: make bench$(env | grep -o '^BENCH_[A-Z_]*=.*' | sort | sed 's/^/ /; s/=\(.*\)/="\1"/' | tr -d '\n')"
echo
{
	printf 'target\tdecisions/s\tp50 ms\tp99 ms\tratio to ceiling\tµs CPU/decision\tRedis µs/script call\tscript calls/decision\tdenied-cache hits/decision\tRedis µs CPU/decision\tscript calls/read\n'
	for t in "${TARGETS[@]}"; do
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$(median "$t" 3)" "$(median "$t" 4)" "$(median "$t" 5)" \
			"$(median "$t" 12)" "$(median "$t" 6)" "$(median "$t" 7)" "$(median "$t" 8)" "$(median "$t" 9)" "$(median "$t" 10)" "$(median "$t" 11)"
	done
} | column -t -s $'\t'
# The client rows' table: their decisions/s, p99, and CPU per decision of
# the service and Redis from $RESULTS; the client's CPU per decision and
# decisions per request from $CLIENT_RESULTS; and the ratio of each
# round's decisions/s to the requests/s of the same store's 1-allowed row
# in that round.
if [ -s "$CLIENT_RESULTS" ]; then
	awk -F'\t' -v OFS='\t' 'NR == FNR {if ($1 ~ / 1-allowed$/) rest[substr($1, 1, index($1, " ") - 1), $2] = $3
			if ($1 ~ / client(-rest)?$/) rate[$1, $2] = $3; next}
		{store = substr($1, 1, index($1, " ") - 1); r = rest[store, $2]
			print $0, r ? sprintf("%.2f", rate[$1, $2] / r) : "-"}' "$RESULTS" "$CLIENT_RESULTS" >"$CLIENT_RESULTS.ratio"
	mv "$CLIENT_RESULTS.ratio" "$CLIENT_RESULTS"
	echo
	echo "client rows: scripts/clientload, $CLIENT_GOROUTINES goroutines, one token of bench_allowed_one per call (a decision)"
	{
		printf 'target\tdecisions/s\tp99 ms\tservice µs CPU/decision\tRedis µs CPU/decision\tclient µs CPU/decision\tdecisions/request\tx 1-allowed requests/s\n'
		for t in "${TARGETS[@]}"; do
			case ${t#* } in client | client-rest) ;; *) continue ;; esac
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$(median "$t" 3)" "$(median "$t" 5)" "$(median "$t" 6)" "$(median "$t" 10)" \
				"$(median "$t" 3 "$CLIENT_RESULTS")" "$(median "$t" 4 "$CLIENT_RESULTS")" "$(median "$t" 5 "$CLIENT_RESULTS")"
		done
	} | column -t -s $'\t'
fi
echo
echo "each round:"
{
	printf 'target\tround\tdecisions/s\tratio to its round'"'"'s ceiling\tµs CPU/decision\tRedis µs CPU/decision\tscript calls/decision\n'
	awk -F'\t' -v OFS='\t' '{print $1, $2, $3, $12, $6, $10, $8}' "$RESULTS"
} | column -t -s $'\t'
[ -z "$NGINX" ] || . "$(dirname "$0")/bench-nginx.sh"
exit $status
