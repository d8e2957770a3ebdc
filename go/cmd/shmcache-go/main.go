// Command shmcache-go reads a shmcache cache with the Go reader. It gives the commands of
// [the readers' contract], with the same arguments, output and exit statuses as every
// other reader's:
//
//	shmcache-go get [--owner USER] [--decode txmeta] NAME HEXKEY...   a line a key: the value in hex, its decode, or -
//	shmcache-go watch [--owner USER] NAME HEXKEY SECONDS   a line each time the outcome changes
//	shmcache-go stats [--owner USER] [--json] NAME         the stats, one JSON object
//	shmcache-go status [--owner USER] [--json] NAME        readiness, one JSON object
//	shmcache-go wait-ready [--owner USER] [--timeout S] [--max-lag N] [--max-behind S] NAME
//
// get --decode txmeta prints each value found as its txmeta decode, one JSON object
// (txmeta.Meta's MarshalJSON), or {"valid":false} for a value that is not one. get exits 0
// when every key hit, 1 when some missed; wait-ready exits 1 when the cache
// is not ready by the timeout, or not within --max-lag messages or --max-behind seconds of
// its topic. An error is one line on stderr, `shmcache-go: KIND:
// message` (KIND as shmcache.Kind gives it), and exit status 2.
//
// [the readers' contract]: https://github.com/shmcache/shmcache/blob/main/docs/reader-contract.md#the-commands
package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/txmeta"
)

const (
	program     = "shmcache-go"
	watchPace   = 10 * time.Millisecond // between a watch's lookups
	waitReadyNS = 50 * time.Millisecond // between wait-ready's looks at the status
	usage       = "usage: shmcache-go get [--owner USER] [--decode txmeta] NAME HEXKEY... | " +
		"watch [--owner USER] NAME HEXKEY SECONDS | " +
		"stats [--owner USER] [--json] NAME | status [--owner USER] [--json] NAME | " +
		"wait-ready [--owner USER] [--timeout S] [--max-lag N] [--max-behind S] NAME"
)

// exit is how a command ends: a status, and a line for stderr (none if "").
type exit struct {
	code int
	line string
}

func (e *exit) Error() string { return e.line }

// failed is an error's exit: status 2 and `shmcache-go: KIND: message`.
func failed(err error) *exit {
	kind := shmcache.Kind(err)
	if kind == "" {
		kind = "error"
	}
	return &exit{2, fmt.Sprintf("%s: %s: %v", program, kind, err)}
}

func badArgument(format string, args ...any) *exit {
	return &exit{2, fmt.Sprintf("%s: bad-argument: %s", program, fmt.Sprintf(format, args...))}
}

// command is a command line, parsed: its options may come anywhere before `--`.
type command struct {
	name    string
	owner   *string
	json    bool
	timeout *float64
	limits  []shmcache.Limit // wait-ready's --max-lag and --max-behind
	decode  string           // get --decode: "txmeta", or "" for the values in hex
	args    []string         // the positional arguments
}

// options are the options each command takes.
var options = map[string][]string{
	"get": {"--owner", "--decode"}, "watch": {"--owner"}, "stats": {"--owner", "--json"}, "status": {"--owner", "--json"},
	"wait-ready": {"--owner", "--timeout", "--max-lag", "--max-behind"},
}

func parse(argv []string) (*command, *exit) {
	if len(argv) == 0 {
		return nil, badArgument("%s", usage)
	}
	c := &command{name: argv[0]}
	allowed, ok := options[c.name]
	if !ok {
		return nil, badArgument("unknown command %q; %s", c.name, usage)
	}
	rest := argv[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			c.args = append(c.args, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" || (len(a) > 1 && a[1] >= '0' && a[1] <= '9') {
			c.args = append(c.args, a)
			continue
		}
		flag, value, hasValue := strings.Cut(a, "=")
		known := false
		for _, o := range allowed {
			known = known || o == flag
		}
		if !known {
			return nil, badArgument("%s takes no option %s; %s", c.name, flag, usage)
		}
		if flag == "--json" {
			if hasValue {
				return nil, badArgument("--json takes no value")
			}
			c.json = true
			continue
		}
		if !hasValue {
			if i+1 >= len(rest) {
				return nil, badArgument("%s needs a value", flag)
			}
			i++
			value = rest[i]
		}
		switch flag {
		case "--owner":
			c.owner = &value
		case "--decode":
			if value != "txmeta" {
				return nil, badArgument("--decode %q: the one decode is txmeta", value)
			}
			c.decode = value
		case "--timeout":
			s, err := seconds(value)
			if err != nil {
				return nil, badArgument("--timeout %q is %v", value, err)
			}
			c.timeout = &s
		case "--max-lag":
			if !countRE.MatchString(value) {
				return nil, badArgument("--max-lag %q is not a count (1-18 digits)", value)
			}
			n, _ := strconv.ParseInt(value, 10, 64) // 18 digits: under 10^18, in range
			c.limits = append(c.limits, shmcache.MaxLag(n))
		case "--max-behind":
			s, err := seconds(value)
			if err != nil {
				return nil, badArgument("--max-behind %q is %v", value, err)
			}
			c.limits = append(c.limits, shmcache.MaxBehind(time.Duration(s*float64(time.Second))))
		}
	}
	want := map[string]string{"get": "NAME HEXKEY...", "watch": "NAME HEXKEY SECONDS", "stats": "NAME",
		"status": "NAME", "wait-ready": "NAME"}[c.name]
	n := len(c.args)
	if (c.name == "get" && n < 2) || (c.name == "watch" && n != 3) || (c.name != "get" && c.name != "watch" && n != 1) {
		return nil, badArgument("%s takes %s; %s", c.name, want, usage)
	}
	return c, nil
}

// countRE is what a count is (golden/contract.json): 1-18 ASCII digits.
var countRE = regexp.MustCompile(`^[0-9]{1,18}$`)

// secondsRE is what a number of seconds is (golden/contract.json): 1-9 ASCII digits,
// optionally a point and 1-9 more; no sign, exponent, underscore, space or infinity.
var secondsRE = regexp.MustCompile(`^[0-9]{1,9}(\.[0-9]{1,9})?$`)

// seconds is a number of seconds as the contract has it.
func seconds(text string) (float64, error) {
	if !secondsRE.MatchString(text) {
		return 0, errors.New("not a number of seconds (digits, optionally a point and more digits, under 10^9)")
	}
	return strconv.ParseFloat(text, 64)
}

// oneLine is a message as one line of output (docs/reader-contract.md): a line break in it,
// as from a name or an argument given with one, written as its escape.
func oneLine(s string) string { return lineBreaks.Replace(s) }

var lineBreaks = strings.NewReplacer("\r", `\r`, "\n", `\n`)

func (c *command) attach() (*shmcache.Cache, error) {
	var opts []shmcache.Option
	if c.owner != nil {
		opts = append(opts, shmcache.WithOwner(*c.owner))
	}
	r, err := shmcache.Attach(c.args[0], opts...)
	if r != nil { // its warnings (a bucket given up, damage read as it stands) on stderr, as the other readers log them
		r.Logf = func(format string, args ...any) { fmt.Fprintln(os.Stderr, oneLine(fmt.Sprintf(format, args...))) }
	}
	return r, err
}

func hexKey(i int, text string) ([]byte, *exit) {
	k, err := hex.DecodeString(text)
	if err != nil {
		return nil, badArgument("key %d %q is not hex", i, text)
	}
	return k, nil
}

// get looks the keys up in one call: a line a key, the value in hex (an empty line for an
// empty value), or with --decode txmeta its decode (one JSON object, {"valid":false} for a
// value that is not a txmeta value), or - for a miss; exit 1 if some missed.
func get(c *command, out io.Writer) *exit {
	keys := make([][]byte, 0, len(c.args)-1)
	for i, text := range c.args[1:] {
		k, bad := hexKey(i, text)
		if bad != nil {
			return bad
		}
		keys = append(keys, k)
	}
	r, err := c.attach()
	if err != nil {
		return failed(err)
	}
	defer r.Close()
	var b shmcache.Batch
	if err := r.GetManyKeys(keys, &b); err != nil {
		return failed(err)
	}
	var lines strings.Builder
	var m txmeta.Meta
	for i := range b.Len() {
		switch {
		case !b.Has(i):
			lines.WriteString("-\n")
		case c.decode == "":
			lines.WriteString(hex.EncodeToString(b.Value(i)) + "\n")
		case m.Decode(b.Value(i)) != nil:
			lines.WriteString(`{"valid":false}` + "\n")
		default:
			raw, err := json.Marshal(&m)
			if err != nil {
				return failed(err)
			}
			lines.Write(append(raw, '\n'))
		}
	}
	io.WriteString(out, lines.String())
	if b.Hits() < b.Len() {
		return &exit{1, ""}
	}
	return nil
}

// watch looks the key up every watchPace for SECONDS with a handle that follows the name
// (while nothing usable is there, every turn tries again) and prints a line, at once,
// each time the outcome changes: hit and its value, miss, or an error and its kind.
func watch(c *command, out io.Writer) *exit {
	key, bad := hexKey(0, c.args[1])
	if bad != nil {
		return bad
	}
	limit, err := seconds(c.args[2])
	if err != nil {
		return badArgument("SECONDS %q is %v", c.args[2], err)
	}
	start := time.Now()
	var r *shmcache.Cache
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	last := ""
	for { // one lookup at least, however short SECONDS: the first outcome is always told
		var line, same string
		if r == nil {
			r, err = c.attach()
			if shmcache.Kind(err) == "bad-argument" { // an invalid name or an unknown owner
				return failed(err)
			}
		}
		var v []byte
		var found bool
		if r != nil {
			v, found, err = r.Get(key)
		}
		switch {
		case err != nil:
			same = "error " + shmcache.Kind(err) // a change of kind is a change of outcome, not of words
			line = fmt.Sprintf("error %s: %v", shmcache.Kind(err), err)
		case found:
			same = "hit " + hex.EncodeToString(v)
			line = same
		default:
			same, line = "miss", "miss"
		}
		if same != last { // ELAPSED: when the outcome was known, after the lookup however long it took
			last = same
			fmt.Fprintf(out, "%.3f %s\n", time.Since(start).Seconds(), oneLine(line))
		}
		if time.Since(start).Seconds() >= limit {
			return nil
		}
		time.Sleep(watchPace)
	}
}

func printJSON(out io.Writer, v any) *exit {
	raw, err := json.Marshal(v)
	if err != nil {
		return failed(err)
	}
	fmt.Fprintf(out, "%s\n", raw)
	return nil
}

// stats prints the stats; the command's handle looks nothing up.
func stats(c *command, out io.Writer) *exit {
	r, err := c.attach()
	if err != nil {
		return failed(err)
	}
	defer r.Close()
	st, err := r.Stats()
	if err != nil {
		return failed(err)
	}
	return printJSON(out, st)
}

func status(c *command, out io.Writer) *exit {
	r, err := c.attach()
	if err != nil {
		return failed(err)
	}
	defer r.Close()
	st, err := r.Status()
	if err != nil {
		return failed(err)
	}
	return printJSON(out, st)
}

// waitReady polls the status every 0.05 s with a handle that follows the name: while
// nothing is at the name (the cache being destroyed and created again) it goes on
// waiting; any other error ends it. Ready: the status, exit 0; past the timeout (none:
// wait for as long as it takes): exit 1, saying why not.
func waitReady(c *command, out io.Writer) *exit {
	start := time.Now()
	var r *shmcache.Cache
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	for {
		var why string
		var err error
		if r == nil {
			r, err = c.attach()
		}
		if r != nil {
			var st shmcache.Status
			if st, err = r.Status(); err == nil && st.Ready {
				if why = st.Beyond(c.limits...); why == "" {
					return printJSON(out, st)
				}
			} else {
				why = st.Why
			}
		}
		if err != nil {
			if !errors.Is(err, shmcache.ErrNotFound) {
				return failed(err)
			}
			why = err.Error()
			var e *shmcache.Error
			if errors.As(err, &e) {
				why = e.Detail
			}
		}
		if took := time.Since(start).Seconds(); c.timeout != nil && took >= *c.timeout {
			return &exit{1, fmt.Sprintf("%s: not-ready: cache '%s' not ready after %.1f s: %s", program, c.args[0],
				*c.timeout, why)}
		}
		time.Sleep(waitReadyNS)
	}
}

// helpText is what --help prints: the usage, a command a line.
const helpText = `usage: shmcache-go COMMAND [OPTIONS] NAME ...

Reads a shmcache cache with the Go reader (the readers' contract: docs/reader-contract.md).

  get [--owner USER] [--decode txmeta] NAME HEXKEY...   a line a key: the value in hex, its decode, or -
  watch [--owner USER] NAME HEXKEY SECONDS              a line each time the outcome changes
  stats [--owner USER] [--json] NAME                    the stats, one JSON object
  status [--owner USER] [--json] NAME                   readiness, one JSON object
  wait-ready [--owner USER] [--timeout S] [--max-lag N] [--max-behind S] NAME
                                                        exit 0 once ready (and no partition more than N
                                                        messages or S seconds behind), 1 at the timeout

Exit status: 0, 1 (get: a key missed; wait-ready: not ready in time), 2 (an error, one line
on stderr: shmcache-go: KIND: message).
`

// isHelp reports whether argv asks for the usage: --help, -h or help, alone or after a command.
func isHelp(argv []string) bool {
	for _, a := range argv {
		if a == "--" {
			return false
		}
		if a == "--help" || a == "-h" {
			return true
		}
	}
	return len(argv) == 1 && argv[0] == "help"
}

func run(argv []string, out io.Writer) *exit {
	if isHelp(argv) {
		fmt.Fprint(out, helpText)
		return nil
	}
	c, bad := parse(argv)
	if bad != nil {
		return bad
	}
	return map[string]func(*command, io.Writer) *exit{"get": get, "watch": watch, "stats": stats, "status": status,
		"wait-ready": waitReady}[c.name](c, out)
}

func main() {
	if e := run(os.Args[1:], os.Stdout); e != nil {
		if e.line != "" {
			fmt.Fprintln(os.Stderr, oneLine(e.line))
		}
		os.Exit(e.code)
	}
}
