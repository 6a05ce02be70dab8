// Command ceiling is the yardstick of `make bench`: a bare net/http server,
// standard library only and default settings, that answers any POST with a
// fixed 150-byte JSON body shaped like a spend's answer. No HTTP JSON service
// on the same machine can answer faster, so the bench reports each target as
// a ratio to it, which holds across machines where requests/s do not.
//
// It listens on -addr (a free loopback port by default) and prints
// "ceiling listening on http://ADDR" once it accepts connections.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
)

// answer is what a one-bucket spend answers, padded to 150 bytes, so that
// the ceiling writes as much as the service does.
const answer = `{"allowed":true,"retry_after_ms":0,"reset_after_ms":1,"decisions":[{"limit":"bench_allowed_one","bucket_id":"1234","allowed":true,"remaining":99999}]}`

func handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer))
	})
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "ceiling listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, handler()))
}
