package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

func TestCRC16(t *testing.T) {
	// The check value of CRC-16/XMODEM, which the Cluster specification
	// quotes.
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestKeySlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 0x31c3},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"user1000", 3443},
		// An empty tag hashes the whole key.
		{"foo{}{bar}", crc16("foo{}{bar}") % slotCount},
		{"{}", crc16("{}") % slotCount},
		// Only the first '{' and the first '}' after it count.
		{"foo{{bar}}zap", crc16("{bar") % slotCount},
		{"foo{bar}{zap}", crc16("bar") % slotCount},
		{"rl:{tag}3:12345678", crc16("tag") % slotCount},
		// No '}' after the '{': no tag.
		{"}foo{", crc16("}foo{") % slotCount},
	} {
		if got := keySlot(tc.key); got != tc.want {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

// TestKeySlotMatchesCluster compares keySlot with CLUSTER KEYSLOT on keys
// like ours and on every shape of hash tag.
func TestKeySlotMatchesCluster(t *testing.T) {
	addrs := testenv.RedisCluster(t)
	c := redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true})
	defer c.Close()
	keys := []string{
		"", "a", "foo", "rl:3:12345678", "rl:7:#q2cm3GbzV0PRgGSuCuCxWw", "rl:1:2001:db8::/48",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{", "}", "{}", "}{", "a{b", "a}b{c}d",
		"{user1000}.following", "\x00\xff\x80 binary", "ünïcödé{ключ}",
	}
	for i := range 200 {
		keys = append(keys, testenv.RandomName("rltest:")+":"+string(rune('0'+i%10))+":pair")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}
