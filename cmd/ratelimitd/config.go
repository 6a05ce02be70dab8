package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// setting is one configuration value: an environment variable, the flag
// that overrides it, and its default. Secrets may also come from the file
// named by the variable with _FILE appended, and are masked in logs.
type setting struct {
	env, flag, def, usage string
	secret                secrecy
	// emptyOff makes the variable set to the empty string turn the
	// feature off; for the others an empty variable is not set.
	emptyOff bool
}

// setEmpty is what getenv returns for a variable set to the empty string,
// which no real value can be.
const setEmpty = "\x00"

// secrecy says how a setting is masked in logs. It goes by the setting,
// never by what its value looks like: a token may well contain "://".
type secrecy int

const (
	// public settings are logged as they are.
	public secrecy = iota
	// secretURL settings are URLs logged without their passwords.
	secretURL
	// secretValue settings are logged only as set or not.
	secretValue
)

// settings lists every configuration value; the README's table follows it.
var settings = []setting{
	{env: "RATELIMIT_HTTP_ADDR", flag: "http-addr", def: "127.0.0.1:8080", usage: "listen address"},
	{env: "RATELIMIT_DEBUG_ADDR", flag: "debug-addr", def: "", usage: "listen address of net/http/pprof; empty turns it off (keep it on loopback)"},
	{env: "RATELIMIT_DATABASE_URL", flag: "database-url", def: "sqlite:ratelimitd.db", usage: `"postgres://..." or "sqlite:PATH"`, secret: secretURL},
	{env: "RATELIMIT_REDIS_URL", flag: "redis-url", def: "", usage: "redis://, redis+cluster:// or redis+sentinel:// URL; empty selects the in-process store", secret: secretURL},
	{env: "RATELIMIT_REDIS_PREFIX", flag: "redis-prefix", def: "rl:", usage: "prefix of every Redis key"},
	{env: "RATELIMIT_REDIS_TIMEOUT", flag: "redis-timeout", def: "250ms", usage: "bound on every Redis call"},
	{env: "RATELIMIT_BOOTSTRAP_TOKEN", flag: "bootstrap-token", def: "", usage: "a secret accepted as an admin token", secret: secretValue},
	{env: "RATELIMIT_SYNC_INTERVAL", flag: "sync-interval", def: "30s", usage: "period of the loader's full reload"},
	{env: "RATELIMIT_FAIL_MODE", flag: "fail-mode", def: "open", usage: "when the store fails: open (allow, degraded) or closed (503)"},
	{env: "RATELIMIT_DENIED_CACHE_SIZE", flag: "denied-cache-size", def: "100000", usage: "buckets known to be empty kept in memory; 0 disables"},
	{env: "RATELIMIT_MIGRATE", flag: "migrate", def: "true", usage: "apply pending migrations before serve, import and token start"},
	{env: "RATELIMIT_LOG_LEVEL", flag: "log-level", def: "info", usage: "debug, info, warn or error"},
	{env: "RATELIMIT_GRPC_ADDR", flag: "grpc-addr", def: "127.0.0.1:8081", usage: "listen address of Envoy's rate limit service (gRPC); empty turns it off", emptyOff: true},
	{env: "RATELIMIT_GRPC_AUTH", flag: "grpc-auth", def: "token", usage: "token (bearer metadata of scope decide or admin required) or none, for a listener only the proxy reaches"},
	{env: "RATELIMIT_GRPC_RESPONSE_HEADERS", flag: "grpc-response-headers", def: "on", usage: "on: the RateLimit, RateLimit-Policy and Retry-After headers in response_headers_to_add; off: none, as envoyproxy/ratelimit unless asked"},
	{env: "RATELIMIT_GRPC_TLS_CERT", flag: "grpc-tls-cert", def: "", usage: "PEM certificate file of the gRPC listener; with the key, it serves TLS"},
	{env: "RATELIMIT_GRPC_TLS_KEY", flag: "grpc-tls-key", def: "", usage: "PEM private key file of the gRPC listener"},
	{env: "RATELIMIT_TRUSTED_PROXIES", flag: "trusted-proxies", def: "127.0.0.0/8, ::1", usage: "CIDRs or addresses of the proxies whose X-Forwarded-For and X-Real-IP are believed (forward auth); empty trusts none", emptyOff: true},
	{env: "RATELIMIT_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "15s", usage: "how long in-flight requests may take to finish on SIGTERM"},
}

// config is the validated configuration of a command.
type config struct {
	HTTPAddr string
	// DebugAddr serves pprof when not empty.
	DebugAddr   string
	DatabaseURL string
	RedisURL    string
	// Redis is RedisURL parsed, nil when it is empty.
	Redis           *redis.UniversalOptions
	RedisPrefix     string
	RedisTimeout    time.Duration
	BootstrapToken  string
	SyncInterval    time.Duration
	FailOpen        bool
	DeniedCacheSize int
	Migrate         bool
	LogLevel        slog.Level
	ShutdownTimeout time.Duration
	// GRPCAddr is empty when the gRPC listener is off.
	GRPCAddr string
	// GRPCAuth is false for RATELIMIT_GRPC_AUTH=none.
	GRPCAuth bool
	// GRPCResponseHeaders is false for RATELIMIT_GRPC_RESPONSE_HEADERS=off.
	GRPCResponseHeaders     bool
	GRPCTLSCert, GRPCTLSKey string
	// TrustedProxies are the proxies whose forwarding headers are
	// believed; empty trusts none.
	TrustedProxies []netip.Prefix

	// raw holds every value as given, for logging.
	raw map[string]string
}

// loadConfig reads the settings from flags (registered on fs and parsed
// from args, before or after the positional arguments), then the
// environment, then the defaults, and validates all of them, reporting
// every bad one at once. It returns the positional arguments.
func loadConfig(fs *flag.FlagSet, args []string, getenv func(string) string) (*config, []string, error) {
	flags := make(map[string]*string, len(settings))
	for _, s := range settings {
		flags[s.flag] = fs.String(s.flag, "", s.help())
	}
	rest, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	raw := make(map[string]string, len(settings))
	var errs []error
	for _, s := range settings {
		v, err := value(s, *flags[s.flag], set[s.flag], getenv)
		if err != nil {
			errs = append(errs, err)
		}
		raw[s.env] = v
	}
	c := &config{raw: raw, HTTPAddr: raw["RATELIMIT_HTTP_ADDR"], DebugAddr: raw["RATELIMIT_DEBUG_ADDR"], DatabaseURL: raw["RATELIMIT_DATABASE_URL"],
		RedisURL: raw["RATELIMIT_REDIS_URL"], RedisPrefix: raw["RATELIMIT_REDIS_PREFIX"], BootstrapToken: raw["RATELIMIT_BOOTSTRAP_TOKEN"]}
	bad := func(env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{env}, args...)...))
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		bad("RATELIMIT_HTTP_ADDR", "want host:port, got %q", c.HTTPAddr)
	}
	if _, _, err := net.SplitHostPort(c.DebugAddr); c.DebugAddr != "" && err != nil {
		bad("RATELIMIT_DEBUG_ADDR", "want host:port or nothing, got %q", c.DebugAddr)
	}
	if !strings.HasPrefix(c.DatabaseURL, "postgres://") && !strings.HasPrefix(c.DatabaseURL, "postgresql://") && !strings.HasPrefix(c.DatabaseURL, "sqlite:") {
		bad("RATELIMIT_DATABASE_URL", `want "postgres://...", "postgresql://..." or "sqlite:PATH"`)
	}
	if c.RedisURL != "" {
		var err error
		if c.Redis, err = redisstore.ParseURL(c.RedisURL); err != nil {
			bad("RATELIMIT_REDIS_URL", "%v", err)
		}
	}
	duration := func(env string, into *time.Duration) {
		d, err := time.ParseDuration(raw[env])
		if err != nil || d <= 0 {
			bad(env, "want a positive duration such as 250ms or 30s, got %q", raw[env])
		}
		*into = d
	}
	duration("RATELIMIT_REDIS_TIMEOUT", &c.RedisTimeout)
	duration("RATELIMIT_SYNC_INTERVAL", &c.SyncInterval)
	duration("RATELIMIT_SHUTDOWN_TIMEOUT", &c.ShutdownTimeout)
	switch raw["RATELIMIT_FAIL_MODE"] {
	case "open":
		c.FailOpen = true
	case "closed":
	default:
		bad("RATELIMIT_FAIL_MODE", "want open or closed, got %q", raw["RATELIMIT_FAIL_MODE"])
	}
	n, err := strconv.Atoi(raw["RATELIMIT_DENIED_CACHE_SIZE"])
	if err != nil || n < 0 {
		bad("RATELIMIT_DENIED_CACHE_SIZE", "want a whole number >= 0, got %q", raw["RATELIMIT_DENIED_CACHE_SIZE"])
	}
	c.DeniedCacheSize = n
	if c.Migrate, err = strconv.ParseBool(raw["RATELIMIT_MIGRATE"]); err != nil {
		bad("RATELIMIT_MIGRATE", "want true or false, got %q", raw["RATELIMIT_MIGRATE"])
	}
	if err := c.LogLevel.UnmarshalText([]byte(raw["RATELIMIT_LOG_LEVEL"])); err != nil {
		bad("RATELIMIT_LOG_LEVEL", "want debug, info, warn or error, got %q", raw["RATELIMIT_LOG_LEVEL"])
	}
	c.GRPCAddr, c.GRPCTLSCert, c.GRPCTLSKey = raw["RATELIMIT_GRPC_ADDR"], raw["RATELIMIT_GRPC_TLS_CERT"], raw["RATELIMIT_GRPC_TLS_KEY"]
	if _, _, err := net.SplitHostPort(c.GRPCAddr); c.GRPCAddr != "" && err != nil {
		bad("RATELIMIT_GRPC_ADDR", "want host:port or empty, got %q", c.GRPCAddr)
	}
	switch raw["RATELIMIT_GRPC_AUTH"] {
	case "token":
		c.GRPCAuth = true
	case "none":
	default:
		bad("RATELIMIT_GRPC_AUTH", "want token or none, got %q", raw["RATELIMIT_GRPC_AUTH"])
	}
	switch raw["RATELIMIT_GRPC_RESPONSE_HEADERS"] {
	case "on":
		c.GRPCResponseHeaders = true
	case "off":
	default:
		bad("RATELIMIT_GRPC_RESPONSE_HEADERS", "want on or off, got %q", raw["RATELIMIT_GRPC_RESPONSE_HEADERS"])
	}
	if c.TrustedProxies, err = clientip.ParsePrefixes(raw["RATELIMIT_TRUSTED_PROXIES"]); err != nil {
		bad("RATELIMIT_TRUSTED_PROXIES", "%v", err)
	}
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		bad("RATELIMIT_GRPC_TLS_CERT", "give both a certificate and a key (RATELIMIT_GRPC_TLS_KEY), or neither")
	}
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("invalid configuration:\n%w", errors.Join(errs...))
	}
	return c, rest, nil
}

// help is the setting's line in -h: what it is, its variable, its default.
func (s setting) help() string {
	return s.usage + " ($" + s.env + ", default " + strconv.Quote(s.def) + ")"
}

// value picks a setting's value: the flag, the variable, the file named by
// the variable's _FILE twin (secrets only), or the default.
func value(s setting, flagValue string, flagSet bool, getenv func(string) string) (string, error) {
	if flagSet {
		return flagValue, nil
	}
	switch v := getenv(s.env); {
	case v == setEmpty && s.emptyOff:
		return "", nil
	case v != "" && v != setEmpty:
		return v, nil
	}
	if path := getenv(s.env + "_FILE"); s.secret != public && path != "" && path != setEmpty {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", s.env, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return s.def, nil
}

// masked returns the configuration for the log, secrets hidden: URLs keep
// everything but their password (in the user part or as a parameter),
// tokens show only whether they are set.
func (c *config) masked() map[string]string {
	out := make(map[string]string, len(c.raw))
	for _, s := range settings {
		v := c.raw[s.env]
		if v != "" {
			switch s.secret {
			case secretURL:
				v = maskURL(v)
			case secretValue:
				v = "(set)"
			}
		}
		out[s.env] = v
	}
	return out
}

// maskURL hides the password of a database or Redis URL. A SQLite path
// holds none; a value that is no URL with a host is hidden whole, as it
// cannot be told where a password in it would be.
func maskURL(v string) string {
	if strings.HasPrefix(v, "sqlite:") {
		return v
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return "(set, not a URL, hidden)"
	}
	// libpq also takes the password as a parameter.
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// newLogger writes JSON lines to w.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
