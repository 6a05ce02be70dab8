#!/usr/bin/env bash
# soak.sh, run by `make soak` (not in CI): loads ratelimitd at a constant
# rate with vegeta and checks that its memory and goroutines stay flat.
#
# vegeta sends each request at its scheduled time, starting another worker
# when all are busy rather than waiting for one, so a slow answer does not
# delay the requests behind it and the latencies count from each request's
# intended send time; a closed-loop tool such as wrk would leave that wait
# out. The rate is SOAK_RATE, or half the maximum throughput of one-bucket
# spends on the in-process store, measured first with wrk (10 s).
#
# The service runs on a free loopback port with a throw-away SQLite
# database; the spends cover SOAK_IDS buckets of a limit that allows them
# all, so that the store holds a steady number of buckets. The script
# reports the service's goroutines, heap, RSS and open files from /metrics:
# before the load, after the warm-up (the reference), every SOAK_EVERY, and
# at the end, still under load. The verdict is "flat" when the end is
# within these tolerances of the reference:
#
#   goroutines         at most 10 more
#   heap in use        at most 25% + 2 MiB more
#   resident memory    at most 25% + 5 MiB more
#   open files         at most 5 more
#
# Each sample is the smallest of five readings 200 ms apart, which leaves
# out what is transient: a request's goroutine, the garbage of the current
# GC cycle. The load is bounded: SOAK_WARMUP + SOAK_DURATION at SOAK_RATE,
# at most SOAK_CONNECTIONS connections and SOAK_MAX_WORKERS requests in
# flight, each given up after 10 s.
#
#   SOAK_DURATION     measured time under load        10m
#   SOAK_WARMUP       load before the reference       30s
#   SOAK_EVERY        time between samples            1m
#   SOAK_RATE         requests/s                      half the measured maximum
#   SOAK_CONNECTIONS  keep-alive connections          64
#   SOAK_MAX_WORKERS  requests in flight at most      1024
#   SOAK_IDS          buckets (<= 65535)              10000
#
# The exit status is 1 when the verdict is not flat, or when a request
# failed or was not allowed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

DURATION=${SOAK_DURATION:-10m}
WARMUP=${SOAK_WARMUP:-30s}
EVERY=${SOAK_EVERY:-1m}
CONNS=${SOAK_CONNECTIONS:-64}
MAX_WORKERS=${SOAK_MAX_WORKERS:-1024}
IDS=${SOAK_IDS:-10000}
VEGETA=github.com/tsenart/vegeta/v12@v12.13.0
[ "$IDS" -ge 1 ] && [ "$IDS" -le 65535 ] || die "SOAK_IDS must be 1 to 65535"

# seconds converts a Go-style duration of whole s, m or h to seconds.
seconds() {
	case $1 in
	*h) echo $((${1%h} * 3600)) ;;
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) die "durations are whole seconds, minutes or hours (30s, 10m, 1h), not $1" ;;
	esac
}
# One assignment a line: set -e sees only the last substitution of a line.
duration_s=$(seconds "$DURATION")
warmup_s=$(seconds "$WARMUP")
every_s=$(seconds "$EVERY")
[ "$duration_s" -ge 10 ] || die "SOAK_DURATION must be at least 10s"
[ "$every_s" -ge 1 ] || die "SOAK_EVERY must be at least 1s"

[ -n "${SOAK_RATE:-}" ] || need_wrk
build
GOBIN="$WORK" "${GO:-go}" install "$VEGETA" || die "go install $VEGETA failed"
start_service
put_limit bench_allowed_one reg_id 1000000000 1000000 1s
wait_decides bench_allowed_one 1
TOKEN=$(decide_token)
# One target a bucket id, which vegeta takes in turn.
jq -nc --arg url "$SVC_URL/v1/spend" --arg auth "Bearer $TOKEN" --argjson ids "$IDS" '
	range(1; $ids + 1) | {method: "POST", url: $url,
		header: {"Authorization": [$auth], "Content-Type": ["application/json"]},
		body: ({buckets: [{limit: "bench_allowed_one", bucket_id: tostring}]} | tojson | @base64)}' >"$WORK/targets"

# sample prints "goroutines heap_inuse_bytes rss_bytes open_fds", each the
# smallest of five readings.
sample() {
	local i
	for i in 1 2 3 4 5; do
		curl -s "$SVC_URL/metrics" | awk '
			$1 == "go_goroutines" {g = $2}
			$1 == "go_memstats_heap_inuse_bytes" {h = $2}
			$1 == "process_resident_memory_bytes" {r = $2}
			$1 == "process_open_fds" {f = $2}
			END {printf "%d %d %d %d\n", g, h, r, f}'
		[ $i = 5 ] || sleep 0.2
	done | awk 'NR == 1 {g = $1; h = $2; r = $3; f = $4}
		{if ($1 < g) g = $1; if ($2 < h) h = $2; if ($3 < r) r = $3; if ($4 < f) f = $4}
		END {print g, h, r, f}'
}

row() { # row LABEL "g h r f"
	set -- "$1" $2
	printf '%-22s %10d %12.1f %12.1f %10d\n' "$1" "$2" "$(echo "$3 / 1048576" | bc -l)" "$(echo "$4 / 1048576" | bc -l)" "$5"
}

if [ -z "${SOAK_RATE:-}" ]; then
	echo "soak: measuring the maximum throughput of one-bucket spends with wrk (10 s)..."
	WRK_THREADS=2 WRK_CONNECTIONS=$CONNS
	wrk_spend "$SVC_URL" "$TOKEN" 2s 1 allowed "$IDS" true >/dev/null
	read -r req secs _ _ bad wrong sock _ < <(wrk_spend "$SVC_URL" "$TOKEN" 10s 1 allowed "$IDS" true)
	[ "$bad$wrong$sock" = 000 ] || die "the maximum run failed: $bad non-2xx, $wrong not allowed, $sock socket errors"
	max=$(awk -v r="$req" -v s="$secs" 'BEGIN {printf "%d", r / s}')
fi
RATE=${SOAK_RATE:-$((max / 2))}
[ "$RATE" -ge 1 ] || die "no throughput measured"

echo
machine
echo "service: $SVC_URL, in-process store${max:+; maximum measured with wrk: $max requests/s}"
echo "load:    vegeta ${VEGETA#*@}, $RATE requests/s over at most $CONNS connections, $WARMUP warm-up then $DURATION, $IDS buckets"
echo "command: make soak$(env | grep -o '^SOAK_[A-Z_]*=.*' | sort | sed 's/^/ /; s/=\(.*\)/="\1"/' | tr -d '\n')"
echo
printf '%-22s %10s %12s %12s %10s\n' sample goroutines "heap MiB" "RSS MiB" "open fds"
row "before the load" "$(sample)"

"$WORK/vegeta" attack -format json -targets "$WORK/targets" -rate "$RATE/1s" -duration "$((warmup_s + duration_s))s" \
	-max-connections "$CONNS" -max-workers "$MAX_WORKERS" -timeout 10s |
	"$WORK/vegeta" report -type json >"$WORK/soak.json" 2>"$WORK/soak.log" &
LOAD_PID=$!
started=$(date +%s)
at() { sleep $((started + $1 - $(date +%s) > 0 ? started + $1 - $(date +%s) : 0)); }

at "$warmup_s"
start=$(sample)
row "after warm-up (${warmup_s}s)" "$start"
# The end sample is taken 5 s before the load stops, so it is under load
# like the reference.
end_at=$((warmup_s + duration_s - 5))
for ((t = warmup_s + every_s; t < end_at; t += every_s)); do
	at "$t"
	row "${t}s" "$(sample)"
done
at "$end_at"
end=$(sample)
row "end (${end_at}s)" "$end"

load_rc=0
wait "$LOAD_PID" || load_rc=$?
LOAD_PID=
[ "$load_rc" = 0 ] || { cat "$WORK/soak.log" >&2; die "vegeta failed"; }
# Every spend must have been allowed: the service's own count of its
# decisions, since vegeta does not read the answers.
not_allowed=$(curl -s "$SVC_URL/metrics" | awk '/^ratelimitd_decisions_total\{/ && /limit="bench_allowed_one"/ && /op="spend"/ &&
	!/result="allowed"/ {n += $2} END {printf "%d\n", n}')
echo
jq -r --argjson rate "$RATE" --argjson na "$not_allowed" '
	def ms: . / 1e6 * 100 | round / 100;
	"requests:   \(.requests) at \(.rate | round) requests/s intended (\($rate)), \(.throughput | round) answered/s",
	"latency ms: p50 \(.latencies["50th"] | ms), p90 \(.latencies["90th"] | ms), p99 \(.latencies["99th"] | ms), max \(.latencies.max | ms), from each request'"'"'s intended send time",
	"answers:    \(.status_codes | to_entries | map("\(.key): \(.value)") | join(", ")), \($na) spends not allowed",
	"errors:     \(.errors | if length == 0 then "none" else join("; ") end)"' "$WORK/soak.json"
echo

read -r g0 h0 r0 f0 <<<"$start"
read -r g1 h1 r1 f1 <<<"$end"
verdict=flat
check() { # check WHAT OK
	if [ "$2" = 1 ]; then echo "  $1: ok"; else echo "  $1: GREW"; verdict="not flat"; fi
}
echo "end against the reference:"
check "goroutines $g0 -> $g1 (at most +10)" "$((g1 <= g0 + 10))"
check "heap in use $((h0 / 1024)) -> $((h1 / 1024)) KiB (at most +25% + 2 MiB)" "$((h1 <= h0 * 5 / 4 + 2 * 1048576))"
check "resident memory $((r0 / 1024)) -> $((r1 / 1024)) KiB (at most +25% + 5 MiB)" "$((r1 <= r0 * 5 / 4 + 5 * 1048576))"
check "open files $f0 -> $f1 (at most +5)" "$((f1 <= f0 + 5))"
echo "verdict: $verdict"
ok=$(jq --argjson na "$not_allowed" '.success == 1 and $na == 0' "$WORK/soak.json")
echo "answers: $([ "$ok" = true ] && echo "every request answered 200 and allowed" || echo "FAILED")"
[ "$verdict" = flat ] && [ "$ok" = true ]
