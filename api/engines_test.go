package api_test

import "bytes"

// engines are the databases the main flows run on. Postgres fails under
// CI=true when it is missing and is skipped elsewhere.
var engines = []struct {
	name string
	opts []envOption
}{
	{"sqlite", nil},
	{"postgres", []envOption{onPostgres()}},
}

func contains(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }
