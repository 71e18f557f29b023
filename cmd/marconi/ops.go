package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// The operator's commands on a running hub: what docs/api.md, "Operators",
// serves under /v1/ops, read and acted on from a terminal
// (docs/operations.md, "Operating from the command line").

// opsCommands are the operator's commands that take flags, by name.
var opsCommands = map[string]func(c cli, ctx context.Context, args []string) error{
	"route":      cli.route,
	"sessions":   cli.sessions,
	"signals":    cli.pendingSignals,
	"disconnect": cli.disconnect,
	"deregister": cli.deregister,
	"fabric":     cli.fabric,
	"apikey":     cli.apikey,
}

// opsUsage is cmd's usage line, the reminder its usage errors end with.
func opsUsage(cmd string) string {
	_, line, _ := strings.Cut(commandHelp(cmd), "usage: ")
	line, _, _ = strings.Cut(line, "\n")
	return "usage: " + line
}

// parseOpsFlags reads cmd's flags wherever they stand and returns the
// positional arguments: -h prints the command's help and flags
// (flag.ErrHelp); an unknown flag is a usage error naming the nearest.
func (c cli) parseOpsFlags(cmd string, fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(c.stdout, commandHelp(cmd))
		fmt.Fprintln(c.stdout)
		fs.SetOutput(c.stdout)
		fs.PrintDefaults()
		return nil, err
	}
	if err != nil {
		return nil, usagef("%v; %s", flagError(fs, err), opsUsage(cmd))
	}
	return pos, nil
}

// opsArgs reads an operator's command line: cmd's flags (declared on fs),
// the hub, and the n positional arguments after its URL.
func (c cli) opsArgs(cmd string, fs *flag.FlagSet, args []string, n int) (opsClient, []string, error) {
	pos, err := c.parseOpsFlags(cmd, fs, args)
	if err != nil {
		return opsClient{}, nil, err
	}
	return c.opsTarget(pos, n, opsUsage(cmd))
}

// sessionArgs is opsArgs of a command on one session: its only positional
// argument (after the hub's URL) is TENANT/PROJECT/SESSION.
func (c cli) sessionArgs(cmd string, fs *flag.FlagSet, args []string) (opsClient, sessionstore.Key, error) {
	o, pos, err := c.opsArgs(cmd, fs, args, 1)
	if err != nil {
		return o, sessionstore.Key{}, err
	}
	k, err := sessionKeyArg(pos[0], opsUsage(cmd))
	return o, k, err
}

// sessionKeyArg reads TENANT/PROJECT/SESSION.
func sessionKeyArg(s, usage string) (sessionstore.Key, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || !signals.ValidSessionID(parts[0]) || !signals.ValidSessionID(parts[1]) || !signals.ValidSessionID(parts[2]) {
		return sessionstore.Key{}, usagef("%q is not TENANT/PROJECT/SESSION (each %s); %s", s, signals.IDForm, usage)
	}
	return sessionstore.Key{TenantID: parts[0], ProjectID: parts[1], SessionID: parts[2]}, nil
}

// keyPath is k's part of an ops path: /tenant/project/session.
func keyPath(k sessionstore.Key) string {
	return "/" + url.PathEscape(k.TenantID) + "/" + url.PathEscape(k.ProjectID) + "/" + url.PathEscape(k.SessionID)
}

func keyString(k sessionstore.Key) string {
	return k.TenantID + "/" + k.ProjectID + "/" + k.SessionID
}

// printJSON writes the hub's answer as it came, for --json.
func (c cli) printJSON(a opsAnswer) error {
	_, err := c.stdout.Write(a.body)
	if err == nil && !strings.HasSuffix(string(a.body), "\n") {
		_, err = fmt.Fprintln(c.stdout)
	}
	return err
}

// ago is an age as a table shows it.
func ago(d time.Duration) string {
	return d.Round(time.Second).String() + " ago"
}

// routeAnswer is what the commands read of a route state
// (GET /v1/ops/route_state, docs/api.md).
type routeAnswer struct {
	TenantID   string             `json:"tenant_id"`
	ProjectID  string             `json:"project_id"`
	SessionID  string             `json:"session_id"`
	RouteState marconi.RouteState `json:"route_state"`
	Queue      struct {
		Attached        bool       `json:"attached"`
		InstanceID      *string    `json:"instance_id"`
		InstanceHealthy bool       `json:"instance_healthy"`
		AttachedAt      *time.Time `json:"attached_at"`
	} `json:"queue"`
	Store *struct {
		Surface           string    `json:"surface"`
		RegisteredAt      time.Time `json:"registered_at"`
		ExpiresAt         time.Time `json:"expires_at"`
		RuntimeMode       string    `json:"runtime_mode"`
		RuntimeModeSource string    `json:"runtime_mode_source"`
		AssignedInstance  *string   `json:"assigned_instance"`
	} `json:"store"`
	FreshestProofOfLife   *time.Time `json:"freshest_proof_of_life"`
	FreshestSource        *string    `json:"freshest_proof_of_life_source"`
	ProofOfLifeAgeSeconds *float64   `json:"proof_of_life_age_seconds"`
	FreshnessSeconds      float64    `json:"freshness_seconds"`
	Selfheal              *struct {
		Enabled         bool    `json:"enabled"`
		EligibleSurface bool    `json:"eligible_surface"`
		RecipientTokens float64 `json:"recipient_tokens"`
		SenderTokens    float64 `json:"sender_tokens"`
	} `json:"selfheal"`
	PendingSignals int    `json:"pending_signals"`
	Explanation    string `json:"explanation"`
}

func (r routeAnswer) key() string { return r.TenantID + "/" + r.ProjectID + "/" + r.SessionID }

// instance is the instance of the session's last queue, or "-".
func (r routeAnswer) instance() string {
	if r.Queue.InstanceID == nil {
		return "-"
	}
	return *r.Queue.InstanceID
}

// proofOfLifeAge is how long ago the session last proved it was alive, as
// the hub counted it, or "-" for no session.
func (r routeAnswer) proofOfLifeAge() string {
	if r.ProofOfLifeAgeSeconds == nil {
		return "-"
	}
	return ago(time.Duration(*r.ProofOfLifeAgeSeconds * float64(time.Second)))
}

// holder says which instance holds the session's WebSocket, and whether it can.
func (r routeAnswer) holder() string {
	q := r.Queue
	switch {
	case q.InstanceID == nil:
		return "none: no instance holds a WebSocket of it"
	case !q.InstanceHealthy:
		return "none: its last queue was on " + *q.InstanceID + ", which is unhealthy"
	case !q.Attached:
		return "none: its last queue was on " + *q.InstanceID + " (healthy), which has restarted since"
	case q.AttachedAt != nil:
		return *q.InstanceID + " (healthy), attached at " + q.AttachedAt.Format(time.RFC3339)
	default:
		return *q.InstanceID + " (healthy)"
	}
}

// route is `marconi route [HUB_URL] TENANT/PROJECT/SESSION [--json]`.
func (c cli) route(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi route", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the hub's route state object as it is")
	o, k, err := c.sessionArgs("route", fs, args)
	if err != nil {
		return err
	}
	var r routeAnswer
	a, err := o.get(ctx, "/v1/ops/route_state"+keyPath(k), "a route state", &r)
	if err != nil || *asJSON {
		return c.printJSONOr(err, a)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%s\t%s\n", r.key(), r.RouteState)
	fmt.Fprintf(w, "\t%s\n", r.Explanation)
	if r.Store == nil {
		return w.Flush()
	}
	fmt.Fprintf(w, "holder\t%s\n", r.holder())
	assigned := "none (" + r.Store.RuntimeMode + ": any instance)"
	if r.Store.AssignedInstance != nil {
		assigned = *r.Store.AssignedInstance + " (" + r.Store.RuntimeMode + ")"
	}
	fmt.Fprintf(w, "assigned\t%s, mode from %s\n", assigned, r.Store.RuntimeModeSource)
	if r.FreshestProofOfLife != nil && r.FreshestSource != nil {
		fmt.Fprintf(w, "proof of life\t%s (%s %s); fresh within %s\n", r.proofOfLifeAge(), *r.FreshestSource,
			r.FreshestProofOfLife.Format(time.RFC3339), time.Duration(r.FreshnessSeconds*float64(time.Second)))
	}
	fmt.Fprintf(w, "pending\t%d signal(s)\n", r.PendingSignals)
	if sh := r.Selfheal; sh != nil {
		switch {
		case !sh.Enabled:
			fmt.Fprintf(w, "self-heal\toff on this instance (MARCONI_SELFHEAL)\n")
		case !sh.EligibleSurface:
			fmt.Fprintf(w, "self-heal\tnot for its surface (%s, piggyback-only)\n", r.Store.Surface)
		default:
			fmt.Fprintf(w, "self-heal\ton; tokens left: %.1f as recipient, %.1f as sender\n", sh.RecipientTokens, sh.SenderTokens)
		}
	}
	fmt.Fprintf(w, "session\t%s, registered %s, expires %s\n", r.Store.Surface,
		r.Store.RegisteredAt.Format(time.RFC3339), r.Store.ExpiresAt.Format(time.RFC3339))
	return w.Flush()
}

// printJSONOr is err when the call failed, else prints its answer (--json).
func (c cli) printJSONOr(err error, a opsAnswer) error {
	if err != nil {
		return err
	}
	return c.printJSON(a)
}

// routeStates are the states `marconi sessions --state` takes: those of a
// live session.
var routeStates = []string{string(marconi.StateAttached), string(marconi.StateRouteWithoutQueue), string(marconi.StateStale)}

// sessions is `marconi sessions [HUB_URL] [--tenant T] [--project P]
// [--state S] [--limit N] [--json]`.
func (c cli) sessions(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi sessions", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "only this tenant's sessions")
	project := fs.String("project", "", "only this project's sessions")
	state := fs.String("state", "", "only sessions in this route state: "+strings.Join(routeStates, ", "))
	limit := fs.Int("limit", 100, "at most this many sessions (the hub takes 1 to 1000)")
	asJSON := fs.Bool("json", false, "print the hub's answer as it is")
	usage := opsUsage("sessions")
	o, _, err := c.opsArgs("sessions", fs, args, 0)
	if err != nil {
		return err
	}
	q := url.Values{}
	for name, v := range map[string]string{"tenant": *tenant, "project": *project} {
		if v != "" && !signals.ValidSessionID(v) {
			return usagef("--%s %q: want %s; %s", name, v, signals.IDForm, usage)
		}
	}
	if *state != "" && !strings.Contains(" "+strings.Join(routeStates, " ")+" ", " "+*state+" ") {
		msg := fmt.Sprintf("--state %q: want one of %s", *state, strings.Join(routeStates, ", "))
		if s := closest(*state, routeStates); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return usagef("%s; %s", msg, usage)
	}
	if *limit < 1 {
		return usagef("--limit %d: want at least 1; %s", *limit, usage)
	}
	for name, v := range map[string]string{"tenant_id": *tenant, "project_id": *project, "state": *state} {
		if v != "" {
			q.Set(name, v)
		}
	}
	q.Set("limit", strconv.Itoa(*limit))
	var list struct {
		Sessions []routeAnswer `json:"sessions"`
	}
	a, err := o.get(ctx, "/v1/ops/route_state?"+q.Encode(), "a list of route states", &list)
	if err != nil || *asJSON {
		return c.printJSONOr(err, a)
	}
	if len(list.Sessions) == 0 {
		fmt.Fprintln(c.stdout, "no live session matches")
		return nil
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SESSION\tSTATE\tINSTANCE\tPROOF OF LIFE\tPENDING")
	for _, r := range list.Sessions {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", r.key(), r.RouteState, r.instance(), r.proofOfLifeAge(), r.PendingSignals)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(list.Sessions) == *limit {
		fmt.Fprintf(c.stderr, "marconi sessions: the first %d shown; there may be more (--limit, up to 1000)\n", *limit)
	}
	return nil
}

// pendingSignals is `marconi signals [HUB_URL] TENANT/PROJECT/SESSION
// [--limit N] [--json]`.
func (c cli) pendingSignals(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi signals", flag.ContinueOnError)
	limit := fs.Int("limit", 50, "at most this many signals, oldest first (the hub takes 1 to 200)")
	asJSON := fs.Bool("json", false, "print the hub's answer as it is")
	o, k, err := c.sessionArgs("signals", fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit %d: want at least 1; %s", *limit, opsUsage("signals"))
	}
	var p struct {
		Total   int `json:"total"`
		Signals []struct {
			ID          string    `json:"id"`
			Seq         int64     `json:"seq"`
			FromSession string    `json:"from_session"`
			Kind        string    `json:"kind"`
			CreatedAt   time.Time `json:"created_at"`
		} `json:"signals"`
	}
	a, err := o.get(ctx, "/v1/ops/sessions"+keyPath(k)+"/signals?limit="+strconv.Itoa(*limit), "a list of signals", &p)
	if err != nil || *asJSON {
		return c.printJSONOr(err, a)
	}
	if p.Total == 0 {
		fmt.Fprintf(c.stdout, "%s has no unacknowledged signal\n", keyString(k))
		return nil
	}
	if len(p.Signals) < p.Total {
		fmt.Fprintf(c.stdout, "%s: %d unacknowledged signal(s), the oldest %d (--limit):\n", keyString(k), p.Total, len(p.Signals))
	} else {
		fmt.Fprintf(c.stdout, "%s: %d unacknowledged signal(s), oldest first:\n", keyString(k), p.Total)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSEQ\tFROM\tKIND\tAGE")
	for _, s := range p.Signals {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", s.ID, s.Seq, s.FromSession, s.Kind, ago(a.age(s.CreatedAt)))
	}
	return w.Flush()
}

// disconnect is `marconi disconnect [HUB_URL] TENANT/PROJECT/SESSION
// [--follow]`: only the instance holding the WebSocket closes it; another
// answers wrong_instance naming it, which --follow calls in turn.
func (c cli) disconnect(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi disconnect", flag.ContinueOnError)
	follow := fs.Bool("follow", false, "when another instance holds the WebSocket, ask that one (once)")
	o, k, err := c.sessionArgs("disconnect", fs, args)
	if err != nil {
		return err
	}
	path := "/v1/ops/sessions" + keyPath(k) + "/disconnect"
	a, err := o.call(ctx, http.MethodPost, path, nil)
	if he, ok := wrongInstance(err); ok {
		where := he.InstanceID
		if he.InstanceURL != "" {
			where += " at " + he.InstanceURL
		}
		if !*follow {
			return fmt.Errorf("%s holds its WebSocket on instance %s, not this one: run marconi disconnect %s %s, or add --follow",
				keyString(k), where, cmp.Or(he.InstanceURL, "INSTANCE_URL"), keyString(k))
		}
		there, ferr := o.followed(he.InstanceURL)
		if ferr != nil {
			return fmt.Errorf("%s holds its WebSocket on instance %s: %w", keyString(k), he.InstanceID, ferr)
		}
		fmt.Fprintf(c.stderr, "marconi disconnect: instance %s holds it; asking it\n", where)
		a, err = there.call(ctx, http.MethodPost, path, nil)
	}
	if err != nil {
		return err
	}
	var d struct {
		Disconnected bool   `json:"disconnected"`
		InstanceID   string `json:"instance_id"`
	}
	if err := a.decode("a disconnection's", &d); err != nil {
		return err
	}
	if !d.Disconnected {
		fmt.Fprintf(c.stdout, "no instance holds a WebSocket of %s (asked %s): nothing to disconnect\n", keyString(k), d.InstanceID)
		return nil
	}
	fmt.Fprintf(c.stdout, "disconnected %s on instance %s (close 1012): its client reconnects, and nothing is lost\n", keyString(k), d.InstanceID)
	return nil
}

// deregister is `marconi deregister [HUB_URL] TENANT/PROJECT/SESSION
// [--yes]`: end a session as DELETE /v1/session does, asking first on a
// terminal, as migrate down does.
func (c cli) deregister(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi deregister", flag.ContinueOnError)
	yes := fs.Bool("yes", false, "do not ask for confirmation (required without a terminal)")
	o, k, err := c.sessionArgs("deregister", fs, args)
	if err != nil {
		return err
	}
	if !*yes {
		if !c.terminal {
			return usagef("not on a terminal, so nothing was changed; pass --yes to confirm")
		}
		var r routeAnswer
		if _, err := o.get(ctx, "/v1/ops/route_state"+keyPath(k), "a route state", &r); err != nil {
			return err
		}
		if r.RouteState == marconi.StateNotRegistered {
			return fmt.Errorf("no live session %s: nothing to deregister", keyString(k))
		}
		fmt.Fprintf(c.stdout, "%s is %s with %d unacknowledged signal(s). Deregistering deletes it and its signals and closes its WebSocket (4410).\n",
			keyString(k), r.RouteState, r.PendingSignals)
		fmt.Fprint(c.stdout, "Type \"yes\" to go on: ")
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			return errors.New("not confirmed; nothing was changed")
		}
	}
	if _, err := o.call(ctx, http.MethodDelete, "/v1/ops/sessions"+keyPath(k), nil); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "deregistered %s: the session and its signals are gone, its WebSocket closed (4410)\n", keyString(k))
	return nil
}

// fabric is `marconi fabric [HUB_URL] [--json]`: the instances and the
// cluster's session totals.
func (c cli) fabric(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi fabric", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the hub's fabric summary as it is")
	o, _, err := c.opsArgs("fabric", fs, args, 0)
	if err != nil {
		return err
	}
	var f struct {
		AdaptivePlacement struct {
			Gate string `json:"gate"`
		} `json:"adaptive_placement"`
		Sessions struct {
			Total    int            `json:"total"`
			ByMode   map[string]int `json:"by_mode"`
			BySource map[string]int `json:"by_source"`
		} `json:"sessions"`
		Instances []hub.FabricInstance `json:"instances"`
		Summary   struct {
			TotalFallbacks     int64 `json:"total_fallbacks"`
			TotalReassignments int64 `json:"total_reassignments"`
		} `json:"summary"`
	}
	a, err := o.get(ctx, "/v1/ops/fabric/summary", "a fabric summary", &f)
	if err != nil || *asJSON {
		return c.printJSONOr(err, a)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "INSTANCE\tURL\tHEALTHY\tDRAINING\tPROCESS\tSESSIONS\tATTACHED\tHEARTBEAT\tBUS KEY")
	for _, in := range f.Instances {
		key := "unknown"
		if in.BusKeyVersion != nil {
			key = strconv.FormatInt(*in.BusKeyVersion, 10)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", in.InstanceID, in.URL, yesNo(in.Healthy), yesNo(in.Draining),
			in.Process, in.Sessions, in.AttachedQueues, ago(a.age(in.LastHeartbeatAt)), key)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "sessions: %d live; by mode %s; by mode source %s\n", f.Sessions.Total, counts(f.Sessions.ByMode), counts(f.Sessions.BySource))
	fmt.Fprintf(c.stdout, "takeovers: %d fallbacks, %d reassignments; adaptive placement %s\n",
		f.Summary.TotalFallbacks, f.Summary.TotalReassignments, f.AdaptivePlacement.Gate)
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// counts is m as "a 1, b 2", by key, or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + strconv.Itoa(m[k])
	}
	return strings.Join(parts, ", ")
}

// apikeyUsage is the one-line reminder a usage error of apikey ends with.
const apikeyUsage = "usage: marconi apikey create [HUB_URL] TENANT PROJECT | revoke [HUB_URL] < KEY_FILE"

// apikey is `marconi apikey create|revoke`. A new key goes to stdout alone
// (KEY=$(marconi apikey create …) keeps it); a key to revoke is read from
// stdin, never from the command line, where shell history and ps keep it.
func (c cli) apikey(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi apikey", flag.ContinueOnError)
	pos, err := c.parseOpsFlags("apikey", fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef(apikeyUsage)
	}
	switch pos[0] {
	case "create":
		return c.apikeyCreate(ctx, pos[1:])
	case "revoke":
		return c.apikeyRevoke(ctx, pos[1:])
	}
	return usagef("%s; %s", unknownSubcommand("apikey", pos[0], []string{"create", "revoke"}), apikeyUsage)
}

func (c cli) apikeyCreate(ctx context.Context, pos []string) error {
	o, pos, err := c.opsTarget(pos, 2, apikeyUsage)
	if err != nil {
		return err
	}
	for _, v := range pos {
		if !signals.ValidSessionID(v) {
			return usagef("%q is not a tenant or project id (%s); %s", v, signals.IDForm, apikeyUsage)
		}
	}
	a, err := o.call(ctx, http.MethodPost, "/v1/ops/api_keys", map[string]string{"tenant_id": pos[0], "project_id": pos[1]})
	if err != nil {
		return err
	}
	var k struct {
		APIKey string `json:"api_key"`
	}
	if err := a.decode("an API key", &k); err != nil {
		return err
	}
	if k.APIKey == "" {
		return errors.New("the hub's answer holds no API key")
	}
	fmt.Fprintln(c.stdout, k.APIKey)
	fmt.Fprintf(c.stderr, "marconi apikey: a new API key for tenant %s, project %s, above: shown this once (the hub keeps only its hash)\n", pos[0], pos[1])
	return nil
}

// apiKeyReadLimit bounds what apikey revoke reads from stdin.
const apiKeyReadLimit = 4 << 10

func (c cli) apikeyRevoke(ctx context.Context, pos []string) error {
	o, _, err := c.opsTarget(pos, 0, apikeyUsage)
	if err != nil {
		return err
	}
	in := c.stdin
	if c.terminal {
		if c.readSecret == nil {
			fmt.Fprint(c.stdout, "API key to revoke (it shows as you type; or pipe it in): ")
		} else {
			fmt.Fprint(c.stdout, "API key to revoke (not shown as you type; or pipe it in): ")
			b, err := c.readSecret()
			fmt.Fprintln(c.stdout) // the Enter typed was not echoed either
			if err != nil {
				return fmt.Errorf("read the API key from the terminal: %w", err)
			}
			in = bytes.NewReader(b)
		}
	}
	key, err := readOneLine(in, c.terminal)
	if err != nil {
		return err
	}
	a, err := o.call(ctx, http.MethodPost, "/v1/ops/api_keys/revoke", map[string]string{"api_key": key})
	if err != nil {
		return err
	}
	var r struct {
		TenantID  string `json:"tenant_id"`
		ProjectID string `json:"project_id"`
	}
	if err := a.decode("a revocation", &r); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "revoked the API key of tenant %s, project %s: it authenticates nothing from now on, on every instance\n", r.TenantID, r.ProjectID)
	fmt.Fprintln(c.stdout, "sessions it registered keep their tokens until they expire: end one with marconi deregister")
	return nil
}

// readOneLine reads the key apikey revoke is given on stdin: one non-empty
// line (on a terminal, the first), spaces around it trimmed.
func readOneLine(r io.Reader, terminal bool) (string, error) {
	if r == nil {
		r = strings.NewReader("")
	}
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(r, apiKeyReadLimit))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
			if terminal {
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read the API key from stdin: %w", err)
	}
	switch len(lines) {
	case 0:
		return "", usagef("no API key on stdin: marconi apikey revoke [HUB_URL] < KEY_FILE (never on the command line, where shell history and ps keep it)")
	case 1:
		return lines[0], nil
	default:
		return "", usagef("stdin holds %d lines: one API key per revoke", len(lines))
	}
}
