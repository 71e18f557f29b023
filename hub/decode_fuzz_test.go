package hub

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// FuzzDecodeBody: any body either decodes into the request or yields one of
// the three documented codes; it never panics.
func FuzzDecodeBody(f *testing.F) {
	for _, seed := range []string{
		`{"to_session":"bob","payload":{"a":[1,2]}}`, `{"to_session":5}`, `[]`, `{} {}`, ``, `{"payload":` + strings.Repeat("[", 100),
		`{"surface":"codex","hints":{"local_state":true}}`, "\xff\xfe", `{"to_session":"\u0000"}`,
	} {
		f.Add(seed)
	}
	e := echo.New()
	f.Fuzz(func(t *testing.T, body string) {
		c := e.NewContext(httptest.NewRequest("POST", "/", strings.NewReader(body)), httptest.NewRecorder())
		var v struct {
			sendRequest
			registerRequest
		}
		err := decodeBody(c, 4096, &v)
		if err == nil {
			return
		}
		switch code := marconi.ErrorCode(err); code {
		case marconi.CodeInvalidJSON, marconi.CodeInvalidField, marconi.CodePayloadTooLarge:
		default:
			t.Fatalf("decodeBody(%q) = %v: code %s is not a documented input error", body, err, code)
		}
	})
}
