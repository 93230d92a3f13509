package redistest

import (
	"testing"
)

// Sentinels is a group of real Sentinel processes (redis-server --sentinel)
// monitoring one master.
type Sentinels struct {
	// MasterName is the name the Sentinels know the master by.
	MasterName string
	// Servers are the Sentinel processes; they can be killed and paused like any Server.
	Servers []*Server
}

// Addrs returns the Sentinels' host:port addresses.
func (g *Sentinels) Addrs() []string {
	addrs := make([]string, len(g.Servers))
	for i, s := range g.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// StartSentinels starts n Sentinels that monitor master under masterName, with
// a quorum of n/2+1, a down-after of one second and a failover timeout of five.
func StartSentinels(t testing.TB, master *Server, n int, masterName string) *Sentinels {
	t.Helper()
	sc := &sentinelConfig{master: master, masterName: masterName, quorum: n/2 + 1}
	servers := StartN(t, n, func(c *config) { c.sentinel = sc })
	return &Sentinels{MasterName: masterName, Servers: servers}
}
