#!/usr/bin/env bash
# soak.sh, run by `make soak` (not in CI): measures the maximum throughput
# of one-bucket spends on the in-process store, then loads ratelimitd at
# half that rate for SOAK_DURATION and reports its goroutines, heap, RSS and
# open files from /metrics: before the load, after the warm-up (the
# reference), every SOAK_EVERY, and at the end, still under load. The
# verdict is "flat" when the end is within these tolerances of the
# reference:
#
#   goroutines         at most 10 more
#   heap in use        at most 25% + 2 MiB more
#   resident memory    at most 25% + 5 MiB more
#   open files         at most 5 more
#
# Each sample is the smallest of five readings 200 ms apart, which leaves
# out what is transient: a request's goroutine, the garbage of the current
# GC cycle. The spends cover SOAK_IDS buckets of a limit that allows them
# all, so that the store holds a steady number of buckets.
#
#   SOAK_DURATION     measured time under load        10m
#   SOAK_WARMUP       load before the reference       30s
#   SOAK_EVERY        time between samples            1m
#   SOAK_RATE         requests/s                      half the measured maximum
#   SOAK_CONNECTIONS  keep-alive connections          64
#   SOAK_IDS          buckets                         10000
#
# The exit status is 1 when the verdict is not flat or a request failed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

DURATION=${SOAK_DURATION:-10m}
WARMUP=${SOAK_WARMUP:-30s}
EVERY=${SOAK_EVERY:-1m}
CONNS=${SOAK_CONNECTIONS:-64}
IDS=${SOAK_IDS:-10000}

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

build
start_service
put_limit soak_allowed reg_id 1000000000 1000000 1s
wait_decides soak_allowed 1
export LOADGEN_TOKEN
LOADGEN_TOKEN=$(decide_token)
BODY='{"buckets":[{"limit":"soak_allowed","bucket_id":"{id}"}]}'

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

echo "soak: measuring the maximum throughput of one-bucket spends (10 s)..."
max=$("$ROOT/bin/loadgen" -url "$SVC_URL/v1/spend" -body "$BODY" -ids "$IDS" -c "$CONNS" -d 10s -warmup 2s \
	-expect '"allowed":true' -format json | jq '.rps | floor')
RATE=${SOAK_RATE:-$((max / 2))}
[ "$RATE" -ge 1 ] || die "no throughput measured"

echo
machine
echo "service: $SVC_URL, in-process store; maximum measured: $max requests/s"
echo "load:    $RATE requests/s over $CONNS connections, $WARMUP warm-up then $DURATION, $IDS buckets"
echo "command: make soak${SOAK_DURATION:+ (SOAK_DURATION=$SOAK_DURATION)}"
echo
printf '%-22s %10s %12s %12s %10s\n' sample goroutines "heap MiB" "RSS MiB" "open fds"
row "before the load" "$(sample)"

"$ROOT/bin/loadgen" -url "$SVC_URL/v1/spend" -body "$BODY" -ids "$IDS" -c "$CONNS" -rate "$RATE" \
	-d "${duration_s}s" -warmup "${warmup_s}s" -expect '"allowed":true' -name soak >"$WORK/soak.report" 2>&1 &
LOADGEN_PID=$!
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
wait "$LOADGEN_PID" || load_rc=$?
LOADGEN_PID=
echo
cat "$WORK/soak.report"
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
[ "$verdict" = flat ] && [ "$load_rc" = 0 ]
