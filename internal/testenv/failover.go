package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timings of the topologies that fail over: short, so that a test's
// failover takes seconds, and long enough that a loaded machine does not
// fail a healthy node over.
const (
	// downAfter is how long a Sentinel, or a Cluster node, waits for a
	// node's answer before it counts it down (Sentinel's
	// down-after-milliseconds, cluster-node-timeout). Not one second: a
	// Sentinel pings once a second, and with a second here the Sentinels
	// that learnt of a failover from another judged the primary it had
	// just promoted down before its first answer, and failed it over
	// again (two runs in two; none in three at 2 s).
	downAfter = 2 * time.Second
	// sentinelFailoverTimeout is Sentinel's failover-timeout: how long a
	// failover may take before another Sentinel may try it again.
	sentinelFailoverTimeout = 3 * time.Second
)

// RedisSentinel is a primary, its two replicas and three Sentinels
// watching them, started for one test: the test may kill the primary and
// watch the Sentinels promote a replica, which the other then replicates.
type RedisSentinel struct {
	// MasterName is the name the Sentinels know the primary by.
	MasterName string
	Primary    *RedisProcess
	Replicas   []*RedisProcess
	// Sentinels are the Sentinels' addresses.
	Sentinels []string
}

// NewRedisSentinel starts a primary, two replicas of it and three
// Sentinels (quorum 2, down after two seconds) on free loopback ports, their
// files in the test's temporary directory, and returns once the replicas
// are in sync and every Sentinel knows them and the other Sentinels, so
// that a failover can happen. Two replicas, as production runs them, so
// that the new primary has a replica too. Everything is killed when the
// test ends, or when the test binary exits however it exits. Without the
// redis-server binary it calls Unavailable.
func NewRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	dir := t.TempDir()
	s := &RedisSentinel{MasterName: "ratelimitd"}
	s.Primary = newRedisProcess(t, subdir(t, dir, "primary"), nil)
	s.Replicas = []*RedisProcess{RedisReplica(t, s.Primary), RedisReplica(t, s.Primary)}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for i := range 3 {
		s.Sentinels = append(s.Sentinels, s.startSentinel(t, subdir(t, dir, "sentinel-"+strconv.Itoa(i))))
	}
	for _, addr := range s.Sentinels {
		if err := s.waitSentinel(ctx, addr); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// RedisReplica starts a replica of the private server primary, on a free
// loopback port, and returns once it is in sync; it is killed when the
// test ends.
func RedisReplica(t testing.TB, primary *RedisProcess) *RedisProcess {
	t.Helper()
	r := newRedisProcess(t, t.TempDir(), func(int) ([]string, error) {
		return []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := waitReplica(ctx, primary.Addr(), r.Addr()); err != nil {
		t.Fatal(err)
	}
	return r
}

// URL returns the service's RATELIMIT_REDIS_URL for the primary the
// Sentinels name.
func (s *RedisSentinel) URL() string {
	return "redis+sentinel://" + strings.Join(s.Sentinels, ",") + "/" + s.MasterName
}

// startSentinel starts one Sentinel in dir on a free port and returns its
// address.
func (s *RedisSentinel) startSentinel(t testing.TB, dir string) string {
	t.Helper()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n",
		s.MasterName, s.Primary.port, downAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		srv, err := startServer(s.Primary.bin, ports[0], dir, false, conf, "--sentinel")
		if err == nil {
			t.Cleanup(srv.stop)
			return srv.addr
		}
		if attempt == 3 {
			t.Fatalf("starting a Sentinel: %v", err)
		}
	}
}

// waitSentinel waits until the Sentinel at addr knows the replicas, up,
// and the two other Sentinels: Sentinels find replicas in their
// primary's INFO and each other through its hello channel, every few
// seconds.
func (s *RedisSentinel) waitSentinel(ctx context.Context, addr string) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	var replicas, sentinels []map[string]string
	var err error
	for {
		replicas, err = c.Replicas(ctx, s.MasterName).Result()
		if err == nil {
			sentinels, err = c.Sentinels(ctx, s.MasterName).Result()
		}
		up := 0
		for _, r := range replicas {
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				up++
			}
		}
		if err == nil && up == len(s.Replicas) && len(sentinels) == 2 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the Sentinel at %s does not know the replicas and the other Sentinels within %v: %v, replicas %v, sentinels %d",
				addr, readyTimeout, err, replicas, len(sentinels))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RedisReplicatedCluster is a Redis Cluster of three primaries with one
// replica each, started for one test: the test may kill a primary and
// watch the Cluster promote its replica.
type RedisReplicatedCluster struct {
	// Primaries and Replicas are the nodes; Replicas[i] replicates
	// Primaries[i].
	Primaries []*RedisProcess
	Replicas  []*RedisProcess
}

// NewRedisReplicatedCluster starts a Cluster of three primaries and three
// replicas (node timeout two seconds, and replicas that may always fail
// over) on free loopback ports, their files in the test's temporary
// directory, and returns once every slot is served and every replica is
// in sync. Everything is killed when the test ends, or when the test
// binary exits however it exits. Unlike RedisCluster, each call starts a
// cluster of its own, since a test that fails a primary over leaves the
// cluster changed.
func NewRedisReplicatedCluster(t testing.TB) *RedisReplicatedCluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(t, "redis-cli", err)
	}
	dir := t.TempDir()
	var nodes []*RedisProcess
	for i := range 6 {
		nodes = append(nodes, newRedisProcess(t, subdir(t, dir, "node-"+strconv.Itoa(i)), func(port int) ([]string, error) {
			ports, err := freePorts(2)
			if err != nil {
				return nil, err
			}
			bus := ports[0]
			if bus == port {
				bus = ports[1]
			}
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", strconv.FormatInt(downAfter.Milliseconds(), 10),
				"--cluster-replica-validity-factor", "0"}, nil
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range nodes {
		if err := waitClusterOK(ctx, n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	// Which node replicates which, once the cluster says it of every
	// node: the replicas' roles reach the others by gossip.
	c := redis.NewClient(&redis.Options{Addr: nodes[0].Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	byAddr := map[string]*RedisProcess{}
	for _, n := range nodes {
		byAddr[n.Addr()] = n
	}
	var rc *RedisReplicatedCluster
	for rc == nil {
		shards, err := c.ClusterShards(ctx).Result()
		if err == nil {
			rc = pairs(shards, byAddr)
		}
		if rc != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the new cluster does not show a replica beside each primary within %v: %v %+v", readyTimeout, err, shards)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for i, p := range rc.Primaries {
		if err := waitReplica(ctx, p.Addr(), rc.Replicas[i].Addr()); err != nil {
			t.Fatal(err)
		}
	}
	return rc
}

// pairs returns the primaries and replicas of shards, nil unless every
// shard is one of the nodes and its replica.
func pairs(shards []redis.ClusterShard, byAddr map[string]*RedisProcess) *RedisReplicatedCluster {
	rc := &RedisReplicatedCluster{}
	for _, sh := range shards {
		var primary, replica *RedisProcess
		for _, n := range sh.Nodes {
			p := byAddr[net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))]
			switch {
			case p == nil:
			case n.Role == "master":
				primary = p
			default:
				replica = p
			}
		}
		if primary == nil || replica == nil || len(sh.Nodes) != 2 {
			return nil
		}
		rc.Primaries, rc.Replicas = append(rc.Primaries, primary), append(rc.Replicas, replica)
	}
	if len(rc.Primaries) != 3 {
		return nil
	}
	return rc
}

// URL returns the service's RATELIMIT_REDIS_URL: every node is a seed, so
// that the client finds the cluster whichever node is down.
func (c *RedisReplicatedCluster) URL() string {
	var addrs []string
	for i, p := range c.Primaries {
		addrs = append(addrs, p.Addr(), c.Replicas[i].Addr())
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// Shard returns the primary that serves key's slot and its replica, as
// the cluster says before any failover.
func (c *RedisReplicatedCluster) Shard(t testing.TB, key string) (primary, replica *RedisProcess) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	client := redis.NewClient(&redis.Options{Addr: c.Primaries[0].Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	slot, err := client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	shards, err := client.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot < r.Start || slot > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role != "master" {
					continue
				}
				addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
				for i, p := range c.Primaries {
					if p.Addr() == addr {
						return p, c.Replicas[i]
					}
				}
			}
		}
	}
	t.Fatalf("no primary of the cluster serves slot %d", slot)
	return nil, nil
}

// waitReplica waits until the replica at replicaAddr is in sync with the
// primary at primaryAddr: its link is up and the primary counts it online.
func waitReplica(ctx context.Context, primaryAddr, replicaAddr string) error {
	p := redis.NewClient(&redis.Options{Addr: primaryAddr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer p.Close()
	r := redis.NewClient(&redis.Options{Addr: replicaAddr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer r.Close()
	var primaryInfo, replicaInfo string
	var err error
	for {
		replicaInfo, err = r.Info(ctx, "replication").Result()
		if err == nil {
			primaryInfo, err = p.Info(ctx, "replication").Result()
		}
		_, port, _ := net.SplitHostPort(replicaAddr)
		if err == nil && strings.Contains(replicaInfo, "master_link_status:up") &&
			strings.Contains(primaryInfo, ",port="+port+",state=online,") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replica %s not in sync with %s within %v: %v\n%s\n%s", replicaAddr, primaryAddr, readyTimeout, err, replicaInfo, primaryInfo)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// subdir makes and returns dir/name.
func subdir(t testing.TB, dir, name string) string {
	t.Helper()
	d := filepath.Join(dir, name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}
