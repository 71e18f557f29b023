package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/haproxytest"
	"github.com/marconihub/marconi/internal/pgcluster"
)

// haproxyFailoverProjects is how many projects TestStoreFailoverBehindHAProxy
// runs, each with one sticky and two stateless agents.
const haproxyFailoverProjects = 4

// TestStoreFailoverBehindHAProxy runs three hub instances behind HAProxy
// (deploy/haproxy.cfg, which hashes on the project) on a primary and its
// synchronous standby, with agents of several projects (the Go client,
// through the balancer) attached on all three and sending to each other
// across instances. Mid-load the primary is crashed and, once every hub
// reports that no server takes writes, the standby is promoted; the old
// primary is rebuilt as the standby and the same is done the other way,
// with the outage held past the instances' dead-after window. The ledger:
// every send answered 200 is delivered once and in order; no send is
// answered 500 (a refusal is a 503, the hub's registry_unavailable or the
// balancer's own page while every hub is out of its pool); after each
// round each instance's liveness lock and wake-up listener are back on the
// new primary, each sees the three processes connected and every agent is
// attached again; no instance ever sees another unhealthy, no sticky
// session is taken over or reassigned, no agent is told affinity_reset
// (docs/operations.md, "What the hub does during a failover"). A send may
// also have no answer: the balancer closing a reused connection it found
// no server for. How long sends were refused and how long until every
// agent was back are logged, not asserted. MARCONI_FAILOVER=long switches
// over back and forth.
//
// It is written here rather than in deploy/ so that the three hubs run
// in-process, under -race, with the failover ledger and pgcluster.
func TestStoreFailoverBehindHAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (three hubs behind HAProxy through two Postgres failovers, one held past the dead-after window): skipped by -short")
	}
	haproxy := haproxytest.Require(t)
	c := pgcluster.New(t)
	lbAddr := haproxytest.FreeAddr(t)
	lbURL := "http://" + lbAddr
	ids := []string{"hub-1", "hub-2", "hub-3"} // the server names in deploy/haproxy.cfg
	var keys, pairs []string
	for p := range haproxyFailoverProjects {
		keys = append(keys, fmt.Sprintf("mak_failover_p%d_local_only", p+1))
		pairs = append(pairs, fmt.Sprintf("%s=t/p%d", keys[p], p+1))
	}
	var addrs [3]string
	var hubs []*Main
	for i, id := range ids {
		addrs[i] = haproxytest.FreeAddr(t)
		hubs = append(hubs, startFailoverHub(t, c.URL(), id, addrs[i], lbURL+"/i/"+id, strings.Join(pairs, ",")))
	}
	haproxytest.Start(t, haproxy, lbAddr, addrs)
	for _, h := range hubs {
		pollUntil(t, h.Config.Hub.InstanceID+" to see the three processes connected", func() bool {
			return processesConnected(t, h, ids...)
		})
	}

	led := newFailoverLedger()
	var agents []*failoverAgent
	var groups [][]*failoverAgent
	for p, key := range keys {
		// Two stateless agents through the balancer, on their project's
		// instance; the second sends only through the balancer (no
		// sending to the recipient's instance), as does the sticky agent,
		// placed on another instance through its /i/ prefix. So their
		// sends to each other cross instances and arrive by wake-ups (the
		// pending sweep is off): the wake-up listeners must listen again
		// on the new primary.
		name := func(i int) string { return fmt.Sprintf("p%d-agent-%d", p+1, i) }
		g := []*failoverAgent{
			dialAgentAt(t, lbURL, key, name(1), "stateless", false, led),
			dialAgentAt(t, lbURL, key, name(2), "stateless", true, led),
		}
		home := queueInstance(t, hubs[0], fmt.Sprintf("t/p%d/%s", p+1, name(1)))
		others := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == home })
		g = append(g, dialAgentAt(t, lbURL+"/i/"+others[p%2], key, name(0), "sticky", true, led))
		if at := queueInstance(t, hubs[0], fmt.Sprintf("t/p%d/%s", p+1, name(0))); at == home {
			t.Fatalf("%s attached on %s, its project's instance: its signals would not cross instances", name(0), at)
		}
		groups = append(groups, g)
		agents = append(agents, g...)
	}
	pollUntil(t, "every agent attached and each instance holding WebSockets", func() bool {
		by := attachedQueues(t, hubs[0])
		return by["hub-1"] > 0 && by["hub-2"] > 0 && by["hub-3"] > 0 && by["hub-1"]+by["hub-2"]+by["hub-3"] == len(agents)
	})
	t.Logf("attached before the failover: %v", attachedQueues(t, hubs[0]))
	sticky := stickyAssignments(t, c.URL())
	if len(sticky) != haproxyFailoverProjects {
		t.Fatalf("%d sticky sessions placed, want %d", len(sticky), haproxyFailoverProjects)
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, g := range groups {
		for i, a := range g {
			wg.Go(func() { a.sendLoop(ctx, g, i, led) })
		}
	}
	health := watchHealth(ctx, &wg, hubs)
	defer func() { stop(); wg.Wait() }()
	led.waitAnswered(t, 100)

	rounds := failoverRounds()
	for round := range rounds {
		before := connectCounts(t, hubs)
		failOver(t, c, hubs, led, agents, round, rounds)
		for _, h := range hubs {
			id := h.Config.Hub.InstanceID
			pollUntil(t, id+" to see the three processes connected on the new primary", func() bool {
				return processesConnected(t, h, ids...)
			})
			pollUntil(t, id+"'s wake-up listener and liveness connection to connect to the new primary", func() bool {
				now := connectCounts(t, []*Main{h})[id]
				return now[0] > before[id][0] && now[1] > before[id][1]
			})
		}
		pollUntil(t, "every agent attached again", func() bool {
			by := attachedQueues(t, hubs[0])
			return by["hub-1"]+by["hub-2"]+by["hub-3"] == len(agents)
		})
		reconnects := 0
		for _, a := range agents {
			reconnects += a.c.Stats().Reconnects
		}
		t.Logf("round %d: attached after the failover: %v; WebSockets redialed so far: %d", round+1, attachedQueues(t, hubs[0]), reconnects)
		led.waitAnswered(t, led.answeredCount()+100)
	}
	stop()
	wg.Wait()

	n := led.waitDelivered(t, 60*time.Second)
	led.verify(t)
	statuses := led.statusCounts()
	t.Logf("%d sends answered 200 and delivered once, in order; answers by status: %v, refusals by code: %v", n, statuses, led.codes())
	for st, k := range statuses {
		switch st {
		case http.StatusOK, http.StatusServiceUnavailable:
		case 0:
			// HAProxy closes a reused client connection without an answer
			// when no server took the request (the hubs left the pool while
			// it retried a 503), so that the client may send it again
			// (haproxy/haproxy#2375): the Go client does, with the same
			// idempotency key, unless SendAttempts is 1 as here.
			t.Logf("%d sends had no answer (the balancer closed the connection), e.g. %v", k, led.noAnswers())
		default:
			t.Errorf("%d sends answered %d across the failover; a store that moves is 503", k, st)
		}
	}
	for code, k := range led.codes() {
		if code != "registry_unavailable" && code != "unexpected_response" {
			t.Errorf("%d sends refused with %s; the failover may refuse only registry_unavailable (or the balancer's 503)", k, code)
		}
	}
	checkNobodyMoved(t, hubs, agents, health, c.URL(), sticky)
}

// connectCounts is, by instance id, how many times each hub's wake-up
// listener and liveness connection have connected.
func connectCounts(t *testing.T, hubs []*Main) map[string][2]float64 {
	t.Helper()
	out := map[string][2]float64{}
	for _, h := range hubs {
		out[h.Config.Hub.InstanceID] = [2]float64{
			metricValue(t, h.URL(), "marconi_pg_listener_connects_total"),
			metricValue(t, h.URL(), "marconi_liveness_connects_total"),
		}
	}
	return out
}

// queueInstance is the instance that m's store records as holding the
// queue of session ("tenant/project/session"), once it is attached.
func queueInstance(t *testing.T, m *Main, session string) string {
	t.Helper()
	var id string
	pollUntil(t, session+" to be attached", func() bool {
		st, s := fabricCall(t, "GET", m.URL()+"/v1/ops/route_state/"+session, failoverAdmin, nil)
		q, _ := s["queue"].(map[string]any)
		id, _ = q["instance_id"].(string)
		return st == http.StatusOK && q["attached"] == true && id != ""
	})
	return id
}

// attachedQueues is, per healthy instance, how many sessions m's fabric
// summary records as attached there.
func attachedQueues(t *testing.T, m *Main) map[string]int {
	t.Helper()
	out := map[string]int{}
	st, s := fabricCall(t, "GET", m.URL()+"/v1/ops/fabric/summary", failoverAdmin, nil)
	if st != http.StatusOK {
		return out
	}
	ins, _ := s["instances"].([]any)
	for _, in := range ins {
		if m, ok := in.(map[string]any); ok && m["healthy"] == true {
			id, _ := m["instance_id"].(string)
			n, _ := m["attached_queues"].(float64)
			out[id] = int(n)
		}
	}
	return out
}
