package redisstore_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

func TestParseURL(t *testing.T) {
	type want struct {
		addrs          []string
		db             int
		user, password string
		master         string
		cluster, tls   bool
		client         string // the type NewUniversalClient makes
	}
	for _, tc := range []struct {
		url  string
		want want
	}{
		{"redis://127.0.0.1:6379", want{addrs: []string{"127.0.0.1:6379"}, client: "*redis.Client"}},
		{"redis://redis.internal:6380/3", want{addrs: []string{"redis.internal:6380"}, db: 3, client: "*redis.Client"}},
		{"redis://h:6379/", want{addrs: []string{"h:6379"}, client: "*redis.Client"}},
		{"redis://[::1]:6379/0", want{addrs: []string{"[::1]:6379"}, client: "*redis.Client"}},
		{"redis://alice:s3cr%2Ft%40x@h:6379", want{addrs: []string{"h:6379"}, user: "alice", password: "s3cr/t@x", client: "*redis.Client"}},
		{"redis://:pw@h:6379", want{addrs: []string{"h:6379"}, password: "pw", client: "*redis.Client"}},
		{"redis://a:p@ss@h:6379", want{addrs: []string{"h:6379"}, user: "a", password: "p@ss", client: "*redis.Client"}},
		{"rediss://h:6380/1", want{addrs: []string{"h:6380"}, db: 1, tls: true, client: "*redis.Client"}},
		{"redis+cluster://n1:7000,n2:7001,n3:7002", want{addrs: []string{"n1:7000", "n2:7001", "n3:7002"}, cluster: true, client: "*redis.ClusterClient"}},
		{"redis+cluster://n1:7000", want{addrs: []string{"n1:7000"}, cluster: true, client: "*redis.ClusterClient"}},
		{"rediss+cluster://u:p@n1:7000,n2:7001/", want{addrs: []string{"n1:7000", "n2:7001"}, user: "u", password: "p", cluster: true, tls: true, client: "*redis.ClusterClient"}},
		{"redis+sentinel://s1:26379,s2:26379/mymaster", want{addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster", client: "*redis.Client"}},
		{"rediss+sentinel://:pw@s1:26379/mymaster", want{addrs: []string{"s1:26379"}, password: "pw", master: "mymaster", tls: true, client: "*redis.Client"}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			o, err := redisstore.ParseURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			got := want{
				addrs: o.Addrs, db: o.DB, user: o.Username, password: o.Password, master: o.MasterName,
				cluster: o.IsClusterMode, tls: o.TLSConfig != nil,
			}
			c := redis.NewUniversalClient(o)
			defer c.Close()
			switch c.(type) {
			case *redis.ClusterClient:
				got.client = "*redis.ClusterClient"
			case *redis.Client:
				got.client = "*redis.Client"
			}
			if !slices.Equal(got.addrs, tc.want.addrs) || got.db != tc.want.db || got.user != tc.want.user ||
				got.password != tc.want.password || got.master != tc.want.master || got.cluster != tc.want.cluster ||
				got.tls != tc.want.tls || got.client != tc.want.client {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if !o.ContextTimeoutEnabled || o.DialTimeout <= 0 || o.ReadTimeout <= 0 || o.WriteTimeout <= 0 || o.PoolTimeout <= 0 {
				t.Fatalf("timeouts not set: %+v", o)
			}
			if o.TLSConfig != nil && o.TLSConfig.ServerName != "" {
				t.Fatalf("TLS pinned to %q, not to each host dialled", o.TLSConfig.ServerName)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, url := range []string{
		"",
		"127.0.0.1:6379",
		"http://h:6379",
		"redis+ring://h:6379",
		"redis+cluster+sentinel://h:6379",
		"unix:///tmp/redis.sock",
		"redis://",
		"redis://h",
		"redis://:6379",
		"redis://h:",
		"redis://h:0",
		"redis://h:65536",
		"redis://h:port",
		"redis://h:6379,g:6379",
		"redis://h:6379/x",
		"redis://h:6379/-1",
		"redis://h:6379/1/2",
		"redis://h:6379?db=1",
		"redis://h:6379#frag",
		"redis://u:secret%zz@h:6379",
		"redis://u%zz:secret@h:6379",
		"redis+cluster://h:6379,",
		"redis+cluster://h:6379/0",
		"redis+sentinel://h:26379",
		"redis+sentinel://h:26379/",
		"redis+sentinel://h:26379/master/1",
		"redis://user:secret/slash@h:6379",
	} {
		t.Run(url, func(t *testing.T) {
			o, err := redisstore.ParseURL(url)
			if err == nil {
				t.Fatalf("accepted, giving %+v", o)
			}
			msg := err.Error()
			if !strings.Contains(msg, "redis+cluster://") || !strings.Contains(msg, "redis+sentinel://") {
				t.Errorf("the error does not name the accepted forms: %s", msg)
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("the error repeats the password: %s", msg)
			}
		})
	}
}
