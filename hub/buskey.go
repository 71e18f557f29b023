package hub

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// BusKeys is what the hub needs of the bus key (pgstore.Store): its version
// in the database, the version this instance seals with, and a rotation.
// The key itself never leaves the store.
type BusKeys interface {
	// BusKey returns the database's key version and when it became
	// current; an error wrapping sessionstore.ErrUnavailable when the
	// store cannot be reached.
	BusKey(ctx context.Context) (version int64, rotatedAt time.Time, err error)
	// BusKeyInUse is the version this instance seals with (0: not read yet).
	BusKeyInUse() int64
	// LoadBusKey is BusKeyInUse, reading the key first when it was not
	// read yet (0 while it cannot be); a new version is logged on log.
	LoadBusKey(ctx context.Context, log *slog.Logger) int64
	// BusKeyRefresh bounds how long every instance takes to seal with a
	// rotated key.
	BusKeyRefresh() time.Duration
	// RotateBusKey makes a new key and returns its version and time;
	// errors as BusKey's.
	RotateBusKey(ctx context.Context) (version int64, rotatedAt time.Time, err error)
}

// busKeyJSON is the answer of GET /v1/ops/bus_key and of its rotation.
type busKeyJSON struct {
	Version   int64     `json:"version"`
	RotatedAt time.Time `json:"rotated_at"`
	// InstanceID and InstanceVersion are the answering instance and the
	// version it seals with; every other instance's is its
	// marconi_bus_key_version.
	InstanceID      string `json:"instance_id"`
	InstanceVersion int64  `json:"instance_version"`
	// RefreshSeconds is the bound within which every instance seals with
	// Version (MARCONI_BUS_KEY_REFRESH_SECONDS).
	RefreshSeconds float64 `json:"refresh_seconds"`
}

// errNoBusKey answers the bus key routes of a hub without one.
var errNoBusKey = marconi.Errorf(marconi.CodeNotFound,
	"this hub has no bus key: it runs on the in-memory store, one instance with no wake-ups between instances to seal")

// opsBusKey is GET /v1/ops/bus_key.
func (s *Server) opsBusKey(c echo.Context) error {
	if s.busKeys == nil {
		return errNoBusKey
	}
	v, at, err := s.busKeys.BusKey(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.busKeyAnswer(v, at))
}

// opsRotateBusKey is POST /v1/ops/bus_key/rotate: a new bus key, which
// this instance seals with at once and every other within
// MARCONI_BUS_KEY_REFRESH_SECONDS.
func (s *Server) opsRotateBusKey(c echo.Context) error {
	if s.busKeys == nil {
		return errNoBusKey
	}
	v, at, err := s.busKeys.RotateBusKey(c.Request().Context())
	if err != nil {
		return err
	}
	s.log.Info("bus key rotated by an operator", "version", v)
	return c.JSON(http.StatusOK, s.busKeyAnswer(v, at))
}

func (s *Server) busKeyAnswer(v int64, at time.Time) busKeyJSON {
	return busKeyJSON{Version: v, RotatedAt: at.UTC(), InstanceID: s.cfg.InstanceID, InstanceVersion: s.busKeys.BusKeyInUse(),
		RefreshSeconds: s.busKeys.BusKeyRefresh().Seconds()}
}
