package hub

import (
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics count HTTP requests by route (the echo route pattern, so the
// label is bounded by the routes the hub declares), method and status, with
// a latency histogram by route and method.
type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	// series holds the series each (route, method, status) resolved to,
	// so that a request counts itself without hashing its labels; bounded
	// as the labels are.
	series sync.Map // httpSeriesKey → *httpSeries
}

type httpSeriesKey struct {
	route, method string
	status        int
}

type httpSeries struct {
	requests prometheus.Counter
	latency  prometheus.Observer // nil for /v1/ws, which is not timed
}

// seriesOf returns the series of a request answered status on route and
// method.
func (m *httpMetrics) seriesOf(route, method string, status int) *httpSeries {
	k := httpSeriesKey{route: route, method: method, status: status}
	if s, ok := m.series.Load(k); ok {
		return s.(*httpSeries)
	}
	s := &httpSeries{requests: m.requests.WithLabelValues(route, method, strconv.Itoa(status))}
	if route != "/v1/ws" {
		s.latency = m.latency.WithLabelValues(route, method)
	}
	m.series.Store(k, s)
	return s
}

func newHTTPMetrics(r prometheus.Registerer) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status code (a WebSocket attach counts once, with 101 when upgraded).",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "marconi_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route pattern and method; WebSocket attaches are not observed (they last as long as the connection).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "method"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// routeLabel is the request's route pattern, bounded: the dashboard's
// catch-all is "/*" and a request that matched no route is "unmatched".
func routeLabel(c echo.Context) string {
	if p := c.Path(); p != "" {
		return p
	}
	return "unmatched"
}

// methodLabel keeps the method label bounded: unknown methods are "other".
func methodLabel(m string) string {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
		return m
	}
	return "other"
}

// observeHTTP is the middleware that counts and times every request. It
// hands an error to the error handler itself, so the status it records is
// the one sent.
func (s *Server) observeHTTP(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if err := next(c); err != nil {
			c.Error(err)
		}
		route, method := routeLabel(c), methodLabel(c.Request().Method)
		status := c.Response().Status
		if route == "/v1/ws" && c.Response().Committed && status == 0 {
			status = 101
		}
		series := s.http.seriesOf(route, method, status)
		series.requests.Inc()
		if series.latency != nil {
			series.latency.Observe(time.Since(start).Seconds())
		}
		return nil
	}
}
