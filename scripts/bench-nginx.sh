# bench-nginx.sh is bench.sh's scenario "nginx", sourced by it after its
# own table: what asking ratelimitd costs a request through nginx, beside
# nginx alone and nginx's own limiter, which is what users compare with.
# wrk (scripts/apikey.lua: POSTs without a body, a new X-Api-Key per
# request over BENCH_IDS keys) drives nginx, which proxies to an upstream
# (bin/ceiling) in one of these ways, each round one after the other:
#
#   nginx              proxying and nothing else: the floor
#   nginx limit_req    limit_req in a zone keyed on X-Api-Key whose rate
#                      no key reaches: nginx's own limiter's cost
#   nginx auth memory  deploy/gateways/nginx/ratelimitd.conf.template,
#   nginx auth redis   filled in with envsubst as docs/gateways.md says:
#                      auth_request asks ratelimitd (on the in-process
#                      store, or on Redis) before each request; a rule of
#                      domain web maps api_key onto a limit that allows
#                      every request, so each request spends one bucket
#                      (the file's other descriptors match no rule)
#
# Each nginx is one process (master_process off) on a free loopback port,
# with its files in $WORK. The upstream, nginx's proxy settings and the
# keep-alive connections are those of the shipped file in every row.
# Columns: requests/s and wrk's p50 and p99, then the CPU time (utime +
# stime from /proc) per request of nginx, ratelimitd, Redis (a private
# redis-server only) and the upstream. A row counts as failed when an
# answer was not 2xx or a socket failed.
#
# Uses bench.sh's settings and helpers (lib.sh, median, the stores, the
# Redis it started) and adds to its exit status.

NGINX_RESULTS="$WORK/nginx-results"
: >"$NGINX_RESULTS"
declare -A NGINX_URL NGINX_PID NGINX_SVC
NGINX_TARGETS=()

# nginx_http PORT [limit_req] prints the http block of the rows without
# ratelimitd: the proxy settings of the shipped file, and with limit_req
# its zone.
nginx_http() {
	cat <<EOF
upstream ratelimitd_app {
    server ${CEILING_URL#http://};
    keepalive 32;
}
${2:+limit_req_zone \$http_x_api_key zone=perkey:10m rate=100000r/s;}
server {
    listen 127.0.0.1:$1;
    location / {
        ${2:+limit_req zone=perkey burst=100000 nodelay;}
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host \$http_host;
        proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        proxy_pass http://ratelimitd_app;
    }
}
EOF
}

# start_nginx TARGET COMMAND... runs nginx for a target on a free port:
# COMMAND PORT prints its server configuration. A port found taken is
# retried.
start_nginx() {
	local t=$1 dir port try i
	shift
	dir="$WORK/nginx.$RANDOM"
	mkdir -p "$dir/tmp"
	for try in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 40000))
		"$@" "$port" >"$dir/server.conf"
		printf 'events {}\nhttp {\n    access_log off;\n    client_body_temp_path tmp/body;\n    proxy_temp_path tmp/proxy;\n    fastcgi_temp_path tmp/fastcgi;\n    uwsgi_temp_path tmp/uwsgi;\n    scgi_temp_path tmp/scgi;\n    include server.conf;\n}\n' >"$dir/nginx.conf"
		nginx -p "$dir/" -c nginx.conf -e "$dir/error.log" -g 'daemon off; master_process off; pid nginx.pid;' &
		NGINX_PID[$t]=$!
		EXTRA_PIDS="$EXTRA_PIDS ${NGINX_PID[$t]}"
		for i in $(seq 50); do
			kill -0 "${NGINX_PID[$t]}" 2>/dev/null || break
			if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
				NGINX_URL[$t]="http://127.0.0.1:$port"
				NGINX_TARGETS+=("$t")
				return 0
			fi
			sleep 0.1
		done
		kill "${NGINX_PID[$t]}" 2>/dev/null || true
		wait "${NGINX_PID[$t]}" 2>/dev/null || true
		grep -q 'Address already in use' "$dir/error.log" || break
	done
	cat "$dir/error.log" >&2
	die "nginx for $t did not start"
}

nginx_http_limited() { nginx_http "$1" limit_req; }

# shipped_server RATELIMITD_URL TOKEN PORT prints the shipped server block
# filled in.
shipped_server() {
	LISTEN_ADDR="127.0.0.1:$3" UPSTREAM_ADDR="${CEILING_URL#http://}" RATELIMITD_ADDR="${1#http://}" RATELIMITD_TOKEN="$2" \
		envsubst '$LISTEN_ADDR $UPSTREAM_ADDR $RATELIMITD_ADDR $RATELIMITD_TOKEN' <"$ROOT/deploy/gateways/nginx/ratelimitd.conf.template"
}

start_ceiling
NGINX_UPSTREAM_PID=$CEILING_PID
start_nginx "nginx" nginx_http
start_nginx "nginx limit_req" nginx_http_limited
for store in $STORES; do
	case $store in
	memory) start_service RATELIMIT_DATABASE_URL="sqlite:$WORK/nginx-memory.db" ${BENCH_GOGC:+GOGC=$BENCH_GOGC} ;;
	redis)
		[ -n "$REDIS_URL_IN_USE" ] || continue
		start_service RATELIMIT_DATABASE_URL="sqlite:$WORK/nginx-redis.db" ${BENCH_GOGC:+GOGC=$BENCH_GOGC} \
			RATELIMIT_REDIS_URL="$REDIS_URL_IN_USE" RATELIMIT_REDIS_PREFIX="$REDIS_PREFIX_IN_USE"
		;;
	# The replicated store's cost is the bench table's; through nginx it
	# would add nothing but what a Redis row shows.
	*) continue ;;
	esac
	put_limit bench_apikey string 1000000000 1000000 1s
	api POST /v1/rules '{"domain":"web","descriptor":[{"key":"api_key"}],"limit":"bench_apikey"}' >/dev/null
	wait_decides bench_apikey k1
	start_nginx "nginx auth $store" shipped_server "$SVC_URL" "$(decide_token)"
	NGINX_SVC["nginx auth $store"]=$SVC_PID
done

# nginx_run ROUND TARGET warms a target up, measures it and appends its
# row to $NGINX_RESULTS: target, round, requests/s, p50 ms, p99 ms, and µs
# of CPU per request of nginx, ratelimitd, Redis and the upstream (- where
# there is none).
nginx_run() {
	local round=$1 t=$2 out req secs p50 p99 bad sock kinds pid svc=${NGINX_SVC[$2]:-} redis=
	local -A c0=() c1=()
	[ "${t##* }" = redis ] && [ -n "$REDIS_PID" ] && redis=$REDIS_PID
	wrk -t "$WRK_THREADS" -c "$WRK_CONNECTIONS" -d "$WARMUP" --timeout 10s -s "$ROOT/scripts/apikey.lua" "${NGINX_URL[$t]}/" -- "$IDS" "$WRK_THREADS" >/dev/null ||
		die "wrk failed on $t"
	for pid in "${NGINX_PID[$t]}" "$svc" "$redis" "$NGINX_UPSTREAM_PID"; do [ -z "$pid" ] || c0[$pid]=$(cpu_ticks "$pid"); done
	out=$(wrk -t "$WRK_THREADS" -c "$WRK_CONNECTIONS" -d "$DURATION" --timeout 10s -s "$ROOT/scripts/apikey.lua" "${NGINX_URL[$t]}/" -- "$IDS" "$WRK_THREADS") ||
		die "wrk failed on $t: $out"
	for pid in "${!c0[@]}"; do c1[$pid]=$(cpu_ticks "$pid"); done
	read -r req secs p50 p99 bad _ sock kinds < <(awk '$1 == "result" {$1 = ""; print substr($0, 2)}' <<<"$out")
	[ -n "$req" ] || die "wrk printed no result: $out"
	if [ "$bad" != 0 ] || [ "$sock" != 0 ]; then
		echo "bench: $t, round $round: $bad non-2xx, $sock socket errors ($kinds)" >&2
		status=1
	fi
	printf '%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$round" "$(awk -v r="$req" -v s="$secs" 'BEGIN {printf "%.0f", r / s}')" \
		"$(awk -v v="$p50" 'BEGIN {printf "%.2f", v / 1000}')" "$(awk -v v="$p99" 'BEGIN {printf "%.2f", v / 1000}')" \
		"$(nginx_per "${NGINX_PID[$t]}")" "$(nginx_per "$svc")" "$(nginx_per "$redis")" "$(nginx_per "$NGINX_UPSTREAM_PID")" >>"$NGINX_RESULTS"
}

# nginx_per PID prints the µs of CPU per request that the process used
# over nginx_run's measured run (its c0, c1 and req), or - without one.
nginx_per() {
	if [ -z "$1" ]; then
		echo -
		return
	fi
	awk -v d=$((c1[$1] - c0[$1])) -v tick="$TICK" -v req="$req" 'BEGIN {printf "%.1f", req ? d / tick * 1e6 / req : 0}'
}

nginx_load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
	echo "bench: nginx, round $round of $ROUNDS" >&2
	for t in "${NGINX_TARGETS[@]}"; do
		nginx_run "$round" "$t"
	done
done

echo
echo "through $(nginx -v 2>&1 | sed 's/^nginx version: //') (one process) to bin/ceiling, wrk with scripts/apikey.lua over $IDS keys;"
echo "load average (1, 5, 15 min): $nginx_load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after"
echo
{
	printf 'target\trequests/s\tp50 ms\tp99 ms\tnginx µs CPU/request\tratelimitd µs CPU/request\tRedis µs CPU/request\tupstream µs CPU/request\n'
	for t in "${NGINX_TARGETS[@]}"; do
		printf '%s' "$t"
		for c in 3 4 5 6 7 8 9; do printf '\t%s' "$(RESULTS=$NGINX_RESULTS median "$t" $c)"; done
		printf '\n'
	done
} | column -t -s $'\t'
