package hub_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawSender sends POST /v1/signals over one keep-alive TCP connection with a
// hand-written HTTP/1.1 request into reused buffers, so that its own
// allocations per send are none: what BenchmarkSend counts per send is
// the hub's (and the recipient reader's), not net/http's client.
type rawSender struct {
	conn net.Conn
	r    *bufio.Reader
	head []byte // the request line and headers, up to Content-Length's value
	req  []byte // the request being built
	body []byte // the send's body being built
	resp []byte // the last answer's body
}

func newRawSender(b *testing.B, addr, token string) *rawSender {
	b.Helper()
	conn, err := net.DialTimeout("tcp", addr, benchTimeout)
	if err != nil {
		b.Fatalf("dial %s: %v", addr, err)
	}
	b.Cleanup(func() { conn.Close() })
	head := "POST /v1/signals HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nContent-Length: "
	return &rawSender{conn: conn, r: bufio.NewReaderSize(conn, 8<<10), head: []byte(head),
		req: make([]byte, 0, 1<<10), body: make([]byte, 0, 256), resp: make([]byte, 0, 1<<10)}
}

// send sends the body benchSendBody would (to, i) and returns the answer's
// status and body; the body is valid until the next send.
func (s *rawSender) send(to string, i int) (int, []byte, error) {
	s.body = append(s.body[:0], `{"to_session":"`...)
	s.body = append(s.body, to...)
	s.body = append(s.body, `","kind":"task.ready","payload":{"task":"T-`...)
	s.body = strconv.AppendInt(s.body, int64(i), 10)
	s.body = append(s.body, `","note":"ready for review"}}`...)
	s.req = append(s.req[:0], s.head...)
	s.req = strconv.AppendInt(s.req, int64(len(s.body)), 10)
	s.req = append(s.req, "\r\n\r\n"...)
	s.req = append(s.req, s.body...)
	if err := s.conn.SetDeadline(time.Now().Add(benchTimeout)); err != nil {
		return 0, nil, err
	}
	if _, err := s.conn.Write(s.req); err != nil {
		return 0, nil, err
	}
	return s.readAnswer()
}

// readAnswer reads one HTTP/1.1 answer with a Content-Length.
func (s *rawSender) readAnswer() (int, []byte, error) {
	line, err := s.r.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	length := -1
	for {
		line, err = s.r.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(name), "Content-Length") {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil {
				return 0, nil, fmt.Errorf("bad Content-Length %q", value)
			}
		}
	}
	if length < 0 {
		return 0, nil, fmt.Errorf("answer %d without Content-Length", status)
	}
	s.resp = append(s.resp[:0], make([]byte, length)...)
	if _, err := io.ReadFull(s.r, s.resp); err != nil {
		return 0, nil, err
	}
	return status, s.resp, nil
}

// BenchmarkSend is POST /v1/signals over real HTTP, one request at a time,
// from a sender that allocates nothing of its own per send (rawSender), so
// that allocs/op and B/op are what a send costs the hub: the server's side
// of the request, and for pushed_to_ws the push to the recipient, which is
// attached and reads (and acks) every frame. They count the recipient's
// reader too (the benchmark's WebSocket client, which decodes and acks each
// frame: about 7 allocs and 0.7 KB a send), so they overstate the hub's
// share slightly, never understate it. For queued_offline the recipient is
// registered but has no WebSocket. ns/op and the send percentiles are a
// send's latency as a client that costs nothing would see it;
// BenchmarkSendNetHTTP is the same with net/http's client.
func BenchmarkSend(b *testing.B) {
	for _, store := range benchStores {
		for _, delivery := range []string{"pushed_to_ws", "queued_offline"} {
			b.Run(store+"/"+delivery, func(b *testing.B) {
				h := benchHub(b, store)
				hc := benchHTTP(b)
				p := newSendPair(b, h, hc, "raw", delivery)
				s := newRawSender(b, strings.TrimPrefix(h.URL, "http://"), p.from.Token)
				want := []byte(`"delivery":"` + delivery + `"`)
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					p.sent++
					st, raw, err := s.send(p.to.ID, int(p.sent))
					if err != nil {
						b.Fatal(err)
					}
					if st != 200 || !bytes.Contains(raw, want) {
						b.Fatalf("send %d: %d %s, want %s; %s; %s", p.sent, st, raw, want, p.reader.stopped(), benchDisconnects(h))
					}
					lat = append(lat, time.Since(t0))
					p.reader.keepUp(b, p.sent)
				}
				if p.reader != nil {
					p.reader.waitSeq(b, p.sent)
				}
				b.StopTimer()
				reportPercentiles(b, "send_", lat)
				b.ReportMetric(float64(p.sent)/b.Elapsed().Seconds(), "sends/s")
			})
		}
	}
}
