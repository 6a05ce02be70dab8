package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// urlForms lists the accepted forms in every error of ParseURL.
const urlForms = "redis://[user:pass@]host:port[/db], " +
	"redis+cluster://[user:pass@]host:port,host:port,..., " +
	"redis+sentinel://[user:pass@]host:port,host:port,.../mastername, " +
	"or the same with rediss for TLS"

// Timeouts of ParseURL's options. The Store's per-call deadline is what
// bounds a decision; these bound what runs without one (a dial in the
// background, a health check). Socket timeouts stay longer than any
// sensible Options.Timeout, so that the call's deadline always comes first
// and go-redis never resends a script whose reply was merely slow.
const (
	dialTimeout = 2 * time.Second
	ioTimeout   = 3 * time.Second
	poolTimeout = time.Second
)

// ParseURL turns RATELIMIT_REDIS_URL into client options for
// redis.NewUniversalClient, which makes a single-node client, a Cluster
// client or a Sentinel failover client from them:
//
//	redis://[user:pass@]host:port[/db]                  single node
//	redis+cluster://[user:pass@]host:port,host:port,...  Redis Cluster (seed nodes)
//	redis+sentinel://[user:pass@]host:port,.../mastername  the primary Sentinel names
//
// and each with rediss for TLS, verified against the host dialled. The user
// and password, percent-encoded, authenticate to the data nodes, not to
// the Sentinels. Query parameters are not accepted: the options that
// matter are set here, ContextTimeoutEnabled above all, without which a
// call's deadline would not bound its network waits. Errors name the
// accepted forms and never repeat the URL, which may hold a password.
func ParseURL(rawURL string) (*redis.UniversalOptions, error) {
	o, err := parseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("invalid Redis URL: %w; accepted forms: %s", err, urlForms)
	}
	return o, nil
}

func parseURL(rawURL string) (*redis.UniversalOptions, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, errors.New("no scheme")
	}
	base, topology, _ := strings.Cut(scheme, "+")
	if base != "redis" && base != "rediss" || topology != "" && topology != "cluster" && topology != "sentinel" {
		return nil, fmt.Errorf("unknown scheme %q", scheme)
	}
	if strings.ContainsAny(rest, "?#") {
		return nil, errors.New("query parameters and fragments are not supported")
	}
	o := &redis.UniversalOptions{
		ContextTimeoutEnabled: true,
		DialTimeout:           dialTimeout,
		ReadTimeout:           ioTimeout,
		WriteTimeout:          ioTimeout,
		PoolTimeout:           poolTimeout,
		// No retries: a script whose reply was lost may have run, and
		// running a refund twice would give back tokens that were never
		// spent. A failed call is an error the fail mode answers; the pool
		// drops dead connections before handing them out.
		MaxRetries: -1,
		// A refused dial is not retried for long: the call's deadline
		// would be spent waiting on a server that is down.
		DialerRetries:      1,
		DialerRetryTimeout: 10 * time.Millisecond,
		// Connections opened for a burst, or after an outage, close
		// when idle instead of staying until the process ends.
		ConnMaxIdleTime: time.Minute,
	}
	if base == "rediss" {
		// No ServerName: crypto/tls takes each node's from the address
		// dialled, which a Cluster's nodes need.
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		var err error
		if o.Username, o.Password, err = userinfo(hosts[:at]); err != nil {
			return nil, err
		}
		hosts = hosts[at+1:]
	}
	for hostport := range strings.SplitSeq(hosts, ",") {
		host, port, err := net.SplitHostPort(hostport)
		if err != nil || host == "" {
			return nil, errors.New("addresses must be host:port")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, errors.New("a port must be a number from 1 to 65535")
		}
		o.Addrs = append(o.Addrs, net.JoinHostPort(host, port))
	}

	switch topology {
	case "":
		if len(o.Addrs) != 1 {
			return nil, errors.New("a single-node URL has one host:port; name several with redis+cluster or redis+sentinel")
		}
		if path != "" {
			db, err := strconv.Atoi(path)
			if err != nil || db < 0 {
				return nil, errors.New("the database must be a number of at least 0")
			}
			o.DB = db
		}
	case "cluster":
		if path != "" {
			return nil, errors.New("a Cluster URL has no path: a Cluster has database 0 only")
		}
		// A single seed address must still make a Cluster client.
		o.IsClusterMode = true
	case "sentinel":
		if path == "" || strings.Contains(path, "/") {
			return nil, errors.New("a Sentinel URL ends with /mastername")
		}
		o.MasterName = path
	}
	return o, nil
}

// userinfo decodes "user:password", "user" or ":password".
func userinfo(s string) (user, password string, err error) {
	user, password, _ = strings.Cut(s, ":")
	if user, err = url.PathUnescape(user); err != nil {
		return "", "", errors.New("the user name is not properly percent-encoded")
	}
	if password, err = url.PathUnescape(password); err != nil {
		return "", "", errors.New("the password is not properly percent-encoded")
	}
	return user, password, nil
}
