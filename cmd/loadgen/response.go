package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Bounds of what the reader accepts: a response beyond them is an error,
// not a reason to grow without limit.
const (
	maxHeaderBytes = 64 << 10
	maxBodyBytes   = 16 << 20
)

// errMalformed wraps every response the reader cannot parse.
var errMalformed = errors.New("malformed response")

// response is one parsed HTTP/1.1 response. body is valid until the next
// read.
type response struct {
	status int
	body   []byte
	// close is true when the server will close the connection after this
	// response: "Connection: close", HTTP/1.0 without keep-alive, or a body
	// that ran to the end of the stream.
	close bool
}

// responseReader parses HTTP/1.x responses from a stream, just enough of
// them for a load test: the status code, the body framed by Content-Length,
// chunked encoding or the end of the stream, and whether the connection
// stays open. Other headers are skipped unparsed. It reuses its buffers, so
// a connection's responses cost no allocation once the buffers have grown
// to the responses' size.
type responseReader struct {
	rd io.Reader
	// buf[start:end] is read and not yet parsed.
	buf        []byte
	start, end int
	// chunks holds a chunked body, which is not contiguous in buf.
	chunks []byte
}

func newResponseReader(rd io.Reader) *responseReader {
	return &responseReader{rd: rd, buf: make([]byte, 16<<10)}
}

// fill reads more of the stream into buf, after moving the unparsed bytes
// to its start, and growing it when it is full.
func (r *responseReader) fill() error {
	if r.start > 0 {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	if r.end == len(r.buf) {
		const most = maxBodyBytes + maxHeaderBytes
		if len(r.buf) >= most {
			return fmt.Errorf("%w: response larger than %d bytes", errMalformed, most)
		}
		r.buf = append(r.buf, make([]byte, min(len(r.buf), most-len(r.buf)))...)
	}
	n, err := r.rd.Read(r.buf[r.end:])
	r.end += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// line returns the next line without its CRLF (or bare LF).
func (r *responseReader) line(limit int) ([]byte, error) {
	scanned := 0
	for {
		if i := bytes.IndexByte(r.buf[r.start+scanned:r.end], '\n'); i >= 0 {
			l := r.buf[r.start : r.start+scanned+i]
			r.start += scanned + i + 1
			return bytes.TrimSuffix(l, []byte{'\r'}), nil
		}
		scanned = r.end - r.start
		if scanned > limit {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errMalformed, limit)
		}
		if err := r.fill(); err != nil {
			if err == io.EOF && scanned > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// need makes n bytes available at buf[start:].
func (r *responseReader) need(n int) error {
	for r.end-r.start < n {
		if err := r.fill(); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// read parses the next response into resp. An io.EOF before its first byte
// means the server closed an idle connection.
func (r *responseReader) read(resp *response) error {
	*resp = response{}
	status, err := r.line(maxHeaderBytes)
	if err != nil {
		return err
	}
	var http10 bool
	if resp.status, http10, err = parseStatusLine(status); err != nil {
		return err
	}
	resp.close = http10
	contentLength, chunked := -1, false
	for headerBytes := len(status); ; {
		l, err := r.line(maxHeaderBytes - headerBytes)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		if len(l) == 0 {
			break
		}
		if headerBytes += len(l); headerBytes > maxHeaderBytes {
			return fmt.Errorf("%w: header larger than %d bytes", errMalformed, maxHeaderBytes)
		}
		name, value, ok := bytes.Cut(l, []byte{':'})
		if !ok {
			return fmt.Errorf("%w: header line %q", errMalformed, l)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, ok := parseDecimal(value)
			if !ok || n > maxBodyBytes || (contentLength >= 0 && n != contentLength) {
				return fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
			contentLength = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			// chunked is the only coding a server may send that this
			// reader must undo; it has to come last.
			chunked = hasTokenSuffix(value, "chunked")
			if !chunked {
				return fmt.Errorf("%w: unsupported Transfer-Encoding %q", errMalformed, value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			switch {
			case containsToken(value, "close"):
				resp.close = true
			case containsToken(value, "keep-alive"):
				resp.close = false
			}
		}
	}
	switch {
	case resp.status < 200 || resp.status == 204 || resp.status == 304:
		// No body, whatever the headers say (RFC 9112, section 6.3).
		if resp.status < 200 {
			return fmt.Errorf("%w: unexpected informational status %d", errMalformed, resp.status)
		}
	case chunked:
		return r.readChunked(resp)
	case contentLength >= 0:
		if err := r.need(contentLength); err != nil {
			return err
		}
		resp.body = r.buf[r.start : r.start+contentLength]
		r.start += contentLength
	default:
		// The body runs to the end of the stream.
		for {
			err := r.fill()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		resp.body, resp.close = r.buf[r.start:r.end], true
		r.start = r.end
	}
	return nil
}

// readChunked reads a chunked body into r.chunks, then skips the trailers.
func (r *responseReader) readChunked(resp *response) error {
	r.chunks = r.chunks[:0]
	for {
		l, err := r.line(1024)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		size, _, _ := bytes.Cut(l, []byte{';'})
		n, ok := parseHex(bytes.TrimSpace(size))
		if !ok || len(r.chunks)+n > maxBodyBytes {
			return fmt.Errorf("%w: chunk size %q", errMalformed, l)
		}
		if n == 0 {
			break
		}
		if err := r.need(n + 2); err != nil {
			return err
		}
		r.chunks = append(r.chunks, r.buf[r.start:r.start+n]...)
		if r.buf[r.start+n] != '\r' || r.buf[r.start+n+1] != '\n' {
			return fmt.Errorf("%w: chunk not followed by CRLF", errMalformed)
		}
		r.start += n + 2
	}
	for trailer := 0; ; {
		l, err := r.line(maxHeaderBytes - trailer)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if len(l) == 0 {
			break
		}
		trailer += len(l)
	}
	resp.body = r.chunks
	return nil
}

// parseStatusLine reads "HTTP/1.x SSS reason" and reports whether the
// version is 1.0.
func parseStatusLine(l []byte) (status int, http10 bool, err error) {
	if len(l) < 12 || !bytes.HasPrefix(l, []byte("HTTP/1.")) || (l[7] != '0' && l[7] != '1') || l[8] != ' ' ||
		(len(l) > 12 && l[12] != ' ') {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, l)
	}
	code, ok := parseDecimal(l[9:12])
	if !ok || code < 100 {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, l)
	}
	return code, l[7] == '0', nil
}

// parseDecimal reads a non-negative decimal number of at most 9 digits.
func parseDecimal(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// parseHex reads a chunk size: at most 7 hexadecimal digits, which is more
// than maxBodyBytes.
func parseHex(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 7 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n*16 + int(d)
	}
	return n, true
}

// containsToken reports whether a comma-separated header value holds token,
// case-insensitively.
func containsToken(value []byte, token string) bool {
	for len(value) > 0 {
		var part []byte
		part, value, _ = bytes.Cut(value, []byte{','})
		if bytes.EqualFold(bytes.TrimSpace(part), []byte(token)) {
			return true
		}
	}
	return false
}

// hasTokenSuffix reports whether the last token of a comma-separated
// header value is token, case-insensitively.
func hasTokenSuffix(value []byte, token string) bool {
	if i := bytes.LastIndexByte(value, ','); i >= 0 {
		value = value[i+1:]
	}
	return bytes.EqualFold(bytes.TrimSpace(value), []byte(token))
}
