package redisstore

// KeySlot exposes keySlot to the tests of the package's API.
func KeySlot(key string) uint16 { return keySlot(key) }
