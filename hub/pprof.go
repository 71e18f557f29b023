package hub

import (
	"net/http"
	"net/http/pprof"
	"strings"
)

// servePprof serves Go's runtime profiles under /debug/pprof/ as
// net/http/pprof does on http.DefaultServeMux, which the hub does not use:
// the index, the named profiles (heap, goroutine, allocs, block, mutex,
// threadcreate), a CPU profile and an execution trace. The route is
// registered only with MARCONI_PPROF on, behind the admin token.
func servePprof(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimPrefix(r.URL.Path, "/debug/pprof/") {
	case "cmdline":
		pprof.Cmdline(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default:
		pprof.Index(w, r) // the index, or the profile its path names
	}
}
