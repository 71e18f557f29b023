package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// FS returns the dashboard's static files (index.html, app.js, style.css) at
// its root. It is safe for concurrent use.
func FS() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		// The embed directive guarantees the directory exists.
		panic(err)
	}
	return sub
}

// contentSecurityPolicy allows nothing from outside the hub: no CDN, no web
// fonts, no inline script, and no framing of the page.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the dashboard. The hub mounts it at "/"; it answers GET and
// HEAD only, and sets headers that keep the page self-contained and always
// fresh (the files change with the binary). It is safe for concurrent use.
func Handler() http.Handler {
	files := http.FileServerFS(FS())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
