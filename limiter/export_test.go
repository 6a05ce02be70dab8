package limiter

import "time"

// Window exposes a calendar window and its length to the tests.
func Window(c Calendar, zone *time.Location, now time.Time) (start, end time.Time, length time.Duration) {
	start, end = window(c, zone, now)
	return start, end, end.Sub(start)
}
