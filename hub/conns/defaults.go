package conns

import (
	"cmp"
	"time"
)

// Defaults of Config's zero fields, each set here only (hub.Config names
// them for cmd/marconi). InstanceID, SessionTTL, TouchInterval and
// StoreTimeout are the hub's and have no default here.
const (
	DefaultPingInterval             = 20 * time.Second
	DefaultReadLimit                = 32768
	DefaultQueueSize                = 256
	DefaultWriteTimeout             = 10 * time.Second
	DefaultAckInterval              = 5 * time.Millisecond
	DefaultFramesPerSecond          = 100
	DefaultMaxConnections           = 100000
	DefaultMaxConnectionsPerAddress = 25000
)

// WithDefaults returns c with each zero field that has a default set to it.
func (c Config) WithDefaults() Config {
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.ReadLimit = cmp.Or(c.ReadLimit, DefaultReadLimit)
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.AckInterval = cmp.Or(c.AckInterval, DefaultAckInterval)
	c.FramesPerSecond = cmp.Or(c.FramesPerSecond, DefaultFramesPerSecond)
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	c.MaxConnectionsPerAddress = cmp.Or(c.MaxConnectionsPerAddress, DefaultMaxConnectionsPerAddress)
	return c
}
