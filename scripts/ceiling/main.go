// Command ceiling is the yardstick of `make bench`: a bare net/http server,
// standard library only and default settings, that answers any POST with a
// fixed 150-byte JSON body shaped like a spend's answer. No HTTP JSON service
// on the same machine can answer faster, so the bench reports each target as
// a ratio to it, which holds across machines where requests/s do not.
//
// With -wait, it is the yardstick of a store that answers from another
// goroutine, as the Redis store does: each handler reads the body to its
// end, as the service does, and then waits until one goroutine, which
// gathers the handlers waiting and answers them together once per wait,
// lets it answer. That goroutine does no work of its own, so what the
// service's CPU per request rises by, from the bare ceiling to this one,
// is what net/http and the scheduler charge a handler for waiting: a park
// and a wake-up, and net/http's background read of the connection, which
// starts when the body has been read and must be stopped before the answer
// (docs/performance.md).
//
// It listens on -addr (a free loopback port by default) and prints
// "ceiling listening on http://ADDR" once it accepts connections.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

// answer is what a one-bucket spend answers, padded to 150 bytes, so that
// the ceiling writes as much as the service does.
const answer = `{"allowed":true,"retry_after_ms":0,"reset_after_ms":1,"decisions":[{"limit":"bench_allowed_one","bucket_id":"1234","allowed":true,"remaining":99999}]}`

// handler answers every POST with answer; with wait > 0, only after
// reading the body and waiting for the next of the rounds that answer the
// handlers waiting, one every wait.
func handler(wait time.Duration) http.Handler {
	var waiting chan chan struct{}
	if wait > 0 {
		waiting = make(chan chan struct{}, 1024)
		go answerEvery(wait, waiting)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if waiting != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			done := make(chan struct{}, 1)
			waiting <- done
			<-done
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer))
	})
}

// answerEvery lets the handlers waiting answer, all that came during a
// wait together, as a store's round trip answers the calls it carries.
func answerEvery(wait time.Duration, waiting chan chan struct{}) {
	var round []chan struct{}
	for done := range waiting {
		round = append(round[:0], done)
	gather:
		for {
			select {
			case done := <-waiting:
				round = append(round, done)
			default:
				break gather
			}
		}
		time.Sleep(wait)
		for _, done := range round {
			done <- struct{}{}
		}
	}
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	wait := flag.Duration("wait", 0, "answer after waiting this long on another goroutine (0: at once)")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "ceiling listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, handler(*wait)))
}
