// Package web is the operator dashboard: plain HTML, CSS and JavaScript
// embedded in the hub binary, with no build step and nothing loaded from
// outside the hub, so it works offline and behind any firewall.
//
// The hub mounts Handler at "/". The page asks the operator for the admin
// token (kept in the tab's sessionStorage only), then reads the JSON of
// /v1/ops/fabric/summary and /v1/ops/route_state with it, and the
// Prometheus text of /metrics without it. It shows instances, sessions by
// route state, pending signals, self-heal outcomes, the adaptive placement
// gate, fallback events, and for one session what its route state means and
// what will heal it. docs/dashboard.md describes each view.
package web
