// savina_go: the Go peer of bench/actors/troupe_actors. The same programs as Troupe's and
// CAF's (bench/peers/caf) with the same parameters, the same message protocol (messages per
// run are equal) and the same result checks, printed as the same `name: value unit` lines,
// so bench/actors/run.sh can put them side by side.
//
//	savina_go [--only NAME] [--reps N] [--workers N]
//
// Built by `make bench-actors` (go build into build/bench/peers/go/, see CMakeLists.txt here);
// run by bench/actors/run.sh, alternating with Troupe, CAF and Erlang benchmark by benchmark.
//
// An actor is a goroutine that owns its state and reads a mailbox: a buffered channel of
// mailboxCap messages. A message is a small struct (kind, two integers, and the sender's
// mailbox where the receiver must answer). A full mailbox blocks its sender, which is Go's
// back-pressure; no benchmark here can fill one in a cycle, so none can deadlock. The one
// exception to mailboxCap: the 1.1 M actors of skynet and the 150 k of fib get a mailbox of
// exactly the messages they can ever receive (a request and their children's answers);
// 1024-message buffers for each would need tens of GB.
//
// Settings: Go's defaults except GOMAXPROCS, set to --workers (default: the online cores, as
// Go does by itself). Each repetition starts with an untimed runtime.GC(), the analogue of the
// fresh runtime Troupe and CAF build per repetition, and is timed from the first spawn until
// every actor goroutine has returned (a sync.WaitGroup), the span Troupe and CAF time.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// Savina's standard parameters and skynet's: bench/actors/benches.h's values.
const (
	pingpongN          = 40000
	countingN          = 1000000
	threadringActors   = 100
	threadringHops     = 100000
	chameneosCreatures = 100
	chameneosMeetings  = 200000
	bigActors          = 120
	bigPings           = 20000
	fjthrputActors     = 60
	fjthrputN          = 10000
	fibN               = 25
	fibExpect          = 75025
	skynetLeaves       = 1000000
	skynetFanout       = 10
	skynetExpect       = 499999500000
	faninTotal         = 2000000
	faninChunk         = 1000
	latencySamples     = 2000
	latencyWarmup      = 20
	latencyGap         = time.Millisecond
	idleActors         = 4
	idleTime           = 2 * time.Second
	maxReps            = 101
	mailboxCap         = 1024
)

type kind uint8

const (
	kStart kind = iota
	kPing
	kPong
	kStop
	kInc
	kGet
	kResult
	kToken
	kExit
	kMeet
	kChange
	kCount
	kWork
	kRequest
	kResponse
	kGo
	kData
	kStamp
	kPoke
)

type msg struct {
	kind kind
	a, b uint64
	from mailbox // where to answer, when the receiver must
}

type mailbox chan msg

func newMailbox() mailbox { return make(mailbox, mailboxCap) }

// spawn runs body as an actor counted by wg.
func spawn(wg *sync.WaitGroup, body func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		body()
	}()
}

var start = time.Now()

// nowNs is monotonic nanoseconds (Go's monotonic clock reading).
func nowNs() uint64 { return uint64(time.Since(start)) }

func msSince(t0 time.Time) float64 { return float64(time.Since(t0).Nanoseconds()) / 1e6 }

// --- pingpong ------------------------------------------------------------------------------

func benchPingpong() (float64, error) {
	var wg sync.WaitGroup
	var pongs uint64
	t0 := time.Now()
	pong, ping := newMailbox(), newMailbox()
	spawn(&wg, func() {
		for m := range pong {
			if m.kind == kStop {
				return
			}
			m.from <- msg{kind: kPong}
		}
	})
	spawn(&wg, func() {
		left := uint64(pingpongN)
		for m := range ping {
			if m.kind == kPong {
				pongs++
			}
			if left == 0 {
				pong <- msg{kind: kStop}
				return
			}
			left--
			pong <- msg{kind: kPing, from: ping}
		}
	})
	ping <- msg{kind: kStart}
	wg.Wait()
	ms := msSince(t0)
	if pongs != pingpongN {
		return ms, fmt.Errorf("%d pongs, expected %d", pongs, pingpongN)
	}
	return ms, nil
}

// --- counting ------------------------------------------------------------------------------

func benchCounting() (float64, error) {
	var wg sync.WaitGroup
	var result uint64
	t0 := time.Now()
	counter, producer := newMailbox(), newMailbox()
	spawn(&wg, func() {
		var count uint64
		for m := range counter {
			if m.kind == kInc {
				count++
				continue
			}
			m.from <- msg{kind: kResult, a: count}
			return
		}
	})
	spawn(&wg, func() {
		for m := range producer {
			if m.kind == kResult {
				result = m.a
				return
			}
			for i := 0; i < countingN; i++ {
				counter <- msg{kind: kInc}
			}
			counter <- msg{kind: kGet, from: producer}
		}
	})
	producer <- msg{kind: kStart}
	wg.Wait()
	ms := msSince(t0)
	if result != countingN {
		return ms, fmt.Errorf("counted %d, expected %d", result, countingN)
	}
	return ms, nil
}

// --- threadring ----------------------------------------------------------------------------

// A token carries the hops left; the holder of the last one sends EXIT, which carries how
// many actors it has still to stop, around the ring.
func benchThreadring() (float64, error) {
	var wg sync.WaitGroup
	var tokens [threadringActors]uint64
	t0 := time.Now()
	ring := make([]mailbox, threadringActors)
	for i := range ring {
		ring[i] = newMailbox()
	}
	for i := range ring {
		self, next, count := ring[i], ring[(i+1)%threadringActors], &tokens[i]
		spawn(&wg, func() {
			for m := range self {
				if m.kind == kToken {
					*count++
					if m.a > 0 {
						next <- msg{kind: kToken, a: m.a - 1}
					} else {
						next <- msg{kind: kExit, a: threadringActors}
					}
					continue
				}
				if m.a > 1 {
					next <- msg{kind: kExit, a: m.a - 1}
				}
				return
			}
		})
	}
	ring[0] <- msg{kind: kToken, a: threadringHops}
	wg.Wait()
	ms := msSince(t0)
	var sum uint64
	for _, t := range tokens {
		sum += t
	}
	if sum != threadringHops+1 {
		return ms, fmt.Errorf("%d token messages, expected %d", sum, threadringHops+1)
	}
	return ms, nil
}

// --- chameneos -----------------------------------------------------------------------------

const (
	red = iota
	yellow
	blue
	faded
)

func complement(c, other uint64) uint64 {
	if c == faded || other == faded {
		return faded
	}
	if c == other {
		return c
	}
	return 3 - c - other
}

func mall(self mailbox, sum *uint64) {
	left := uint64(chameneosMeetings)
	var waiting mailbox
	fadedN := 0
	for m := range self {
		switch {
		case m.kind == kCount:
			*sum += m.a
			if fadedN++; fadedN == chameneosCreatures {
				return
			}
		case left == 0:
			m.from <- msg{kind: kExit}
		case waiting == nil:
			waiting = m.from
		default:
			left--
			waiting <- msg{kind: kMeet, a: m.a, from: m.from}
			waiting = nil
		}
	}
}

func creature(self, mall mailbox, color uint64) {
	var meetings uint64
	mall <- msg{kind: kMeet, a: color, from: self}
	for m := range self {
		switch m.kind {
		case kMeet:
			color = complement(color, m.a)
			meetings++
			m.from <- msg{kind: kChange, a: color}
		case kChange:
			color = m.a
			meetings++
		default: // kExit
			mall <- msg{kind: kCount, a: meetings}
			return
		}
		mall <- msg{kind: kMeet, a: color, from: self}
	}
}

func benchChameneos() (float64, error) {
	var wg sync.WaitGroup
	var sum uint64
	t0 := time.Now()
	m := newMailbox()
	spawn(&wg, func() { mall(m, &sum) })
	for i := 0; i < chameneosCreatures; i++ {
		self, color := newMailbox(), uint64(i%3)
		spawn(&wg, func() { creature(self, m, color) })
	}
	wg.Wait()
	ms := msSince(t0)
	if sum != 2*chameneosMeetings {
		return ms, fmt.Errorf("%d meetings counted, expected %d", sum, 2*chameneosMeetings)
	}
	return ms, nil
}

// --- big -----------------------------------------------------------------------------------

// benchRand is harness.h's bench_rand: the same LCG, so every side makes the same choices.
func benchRand(state *uint64, bound uint32) uint32 {
	*state = *state*6364136223846793005 + 1442695040888963407
	return uint32((*state >> 33) % uint64(bound))
}

type bigResult struct{ pongs, errors uint64 }

// A ping or pong carries its sender's index (a), -1 as ^0 for the first pong.
func bigActor(id int, all []mailbox, sink mailbox, out *bigResult) {
	const none = ^uint64(0)
	expected, rng, pings := none, uint64(id)+1, 0
	for m := range all[id] {
		switch m.kind {
		case kPing:
			all[m.a] <- msg{kind: kPong, a: uint64(id)}
		case kPong:
			if m.a != none {
				out.pongs++
			}
			if m.a != expected {
				out.errors++
			}
			if pings == bigPings {
				sink <- msg{kind: kExit}
				continue
			}
			expected = uint64(benchRand(&rng, bigActors))
			pings++
			all[expected] <- msg{kind: kPing, a: uint64(id)}
		default: // kExit
			return
		}
	}
}

func benchBig() (float64, error) {
	var wg sync.WaitGroup
	res := make([]bigResult, bigActors)
	t0 := time.Now()
	sink := newMailbox()
	all := make([]mailbox, bigActors)
	for i := range all {
		all[i] = newMailbox()
	}
	spawn(&wg, func() {
		for exits := 0; exits < bigActors; exits++ {
			<-sink
		}
		for _, b := range all {
			b <- msg{kind: kExit}
		}
	})
	for i := range all {
		id := i
		spawn(&wg, func() { bigActor(id, all, sink, &res[id]) })
	}
	for _, b := range all {
		b <- msg{kind: kPong, a: ^uint64(0)}
	}
	wg.Wait()
	ms := msSince(t0)
	var pongs, errors uint64
	for _, r := range res {
		pongs += r.pongs
		errors += r.errors
	}
	if pongs != bigActors*bigPings || errors != 0 {
		return ms, fmt.Errorf("%d pongs (expected %d), %d from the wrong actor", pongs,
			bigActors*bigPings, errors)
	}
	return ms, nil
}

// --- fjthrput ------------------------------------------------------------------------------

var fjTheta = 37.2 // a variable, so that sin() is computed per message

type fjResult struct {
	handled uint64
	acc     float64
}

func benchFjthrput() (float64, error) {
	var wg sync.WaitGroup
	res := make([]fjResult, fjthrputActors)
	t0 := time.Now()
	all := make([]mailbox, fjthrputActors)
	for i := range all {
		self, out := newMailbox(), &res[i]
		all[i] = self
		spawn(&wg, func() {
			for range self {
				sint := math.Sin(fjTheta)
				out.acc += sint * sint
				if out.handled++; out.handled == fjthrputN {
					return
				}
			}
		})
	}
	for n := 0; n < fjthrputN; n++ {
		for _, x := range all {
			x <- msg{kind: kWork}
		}
	}
	wg.Wait()
	ms := msSince(t0)
	var handled uint64
	for _, r := range res {
		handled += r.handled
	}
	if handled != fjthrputActors*fjthrputN || !(res[0].acc > 0) {
		return ms, fmt.Errorf("%d messages handled, expected %d", handled,
			fjthrputActors*fjthrputN)
	}
	return ms, nil
}

// --- fib and skynet: one actor per call of a recursion ---------------------------------------

// treeNode is a call of fib (fanout 2) or skynet (fanout 10). It waits for its request
// (fib: a = n; skynet: a = num, b = size), answers a leaf's value at once, or spawns its
// children, sends each its request, and answers the sum of their answers. The root's answer
// goes to a mailbox of main's.
func treeNode(wg *sync.WaitGroup, self mailbox, fanout int) {
	req := <-self
	var leaf bool
	var value uint64
	if fanout == 2 {
		leaf, value = req.a <= 2, 1
	} else {
		leaf, value = req.b == 1, req.a
	}
	if leaf {
		req.from <- msg{kind: kResponse, a: value}
		return
	}
	for i := 0; i < fanout; i++ {
		child := make(mailbox, fanout+1)
		spawn(wg, func() { treeNode(wg, child, fanout) })
		if fanout == 2 {
			child <- msg{kind: kRequest, a: req.a - 1 - uint64(i), from: self}
		} else {
			step := req.b / skynetFanout
			child <- msg{kind: kRequest, a: req.a + uint64(i)*step, b: step, from: self}
		}
	}
	var sum uint64
	for i := 0; i < fanout; i++ {
		sum += (<-self).a
	}
	req.from <- msg{kind: kResponse, a: sum}
}

func runTree(fanout int, req msg) (uint64, float64) {
	var wg sync.WaitGroup
	answer := make(mailbox, 1)
	req.from = answer
	t0 := time.Now()
	root := make(mailbox, fanout+1)
	spawn(&wg, func() { treeNode(&wg, root, fanout) })
	root <- req
	wg.Wait()
	ms := msSince(t0)
	return (<-answer).a, ms
}

func benchFib() (float64, error) {
	result, ms := runTree(2, msg{kind: kRequest, a: fibN})
	if result != fibExpect {
		return ms, fmt.Errorf("fib(%d) = %d, expected %d", fibN, result, fibExpect)
	}
	return ms, nil
}

func benchSkynet() (float64, error) {
	result, ms := runTree(skynetFanout, msg{kind: kRequest, a: 0, b: skynetLeaves})
	if result != skynetExpect {
		return ms, fmt.Errorf("sum %d, expected %d", result, uint64(skynetExpect))
	}
	return ms, nil
}

// --- fan-in --------------------------------------------------------------------------------

// P producers share faninTotal messages to one consumer, faninChunk per GO message they send
// themselves. The consumer sums the sequence numbers to check nothing was lost.
func faninOnce(p uint64) (float64, error) {
	var wg sync.WaitGroup
	var received, sum uint64
	per := uint64(faninTotal) / p
	t0 := time.Now()
	consumer := newMailbox()
	spawn(&wg, func() {
		for m := range consumer {
			sum += m.a
			if received++; received == faninTotal {
				return
			}
		}
	})
	producers := make([]mailbox, p)
	for i := range producers {
		self := newMailbox()
		producers[i] = self
		spawn(&wg, func() {
			left := per
			for range self {
				n := left
				if n > faninChunk {
					n = faninChunk
				}
				for i := uint64(0); i < n; i++ {
					consumer <- msg{kind: kData, a: left - i}
				}
				if left -= n; left == 0 {
					return
				}
				self <- msg{kind: kGo}
			}
		})
	}
	for _, x := range producers {
		x <- msg{kind: kGo}
	}
	wg.Wait()
	ms := msSince(t0)
	if received != faninTotal || sum != p*(per*(per+1)/2) {
		return ms, fmt.Errorf("received %d, expected %d", received, faninTotal)
	}
	return ms, nil
}

func benchFanin(a *args) error {
	for _, p := range []uint64{1, 2, 4, 8} {
		name := fmt.Sprintf("fanin_%d", p)
		if !a.selected(name) {
			continue
		}
		ms := make([]float64, a.reps)
		for r := range ms {
			runtime.GC()
			var err error
			if ms[r], err = faninOnce(p); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
				return err
			}
		}
		printResult(name, faninTotal/(median(ms)/1e3)/1e6, "Mmsg/s")
	}
	return nil
}

// --- latency and idle CPU ------------------------------------------------------------------

// latency: main sleeps ~1 ms, then sends one message to an actor parked on its mailbox; the
// actor records (time it runs - send time), warm-up dropped. Troupe's latency is the same
// program (an actor woken by a runtime timer sends to another). Troupe's wakeup, whose sender
// is a thread outside the runtime, has no Go program: every goroutine runs inside Go's runtime.
// p50, p90, p99 and max: each the median over --reps runs (harness.h's bench_latency_reps).
func latencyOnce(samples []uint64) error {
	var wg sync.WaitGroup
	n := 0
	x := newMailbox()
	spawn(&wg, func() {
		for m := range x {
			now := nowNs()
			if n >= latencyWarmup {
				samples[n-latencyWarmup] = now - m.a
			}
			if n++; n == latencyWarmup+latencySamples {
				return
			}
		}
	})
	for i := 0; i < latencyWarmup+latencySamples; i++ {
		time.Sleep(latencyGap)
		x <- msg{kind: kStamp, a: nowNs()}
	}
	wg.Wait()
	if n != latencyWarmup+latencySamples {
		return fmt.Errorf("latency: %d messages handled", n)
	}
	return nil
}

func benchLatency(a *args) error {
	pcts := []float64{50, 90, 99, 100}
	rows := make([][]float64, len(pcts))
	samples := make([]uint64, latencySamples)
	for r := 0; r < a.reps; r++ {
		runtime.GC()
		if err := latencyOnce(samples); err != nil {
			return err
		}
		sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
		for i, p := range pcts {
			rows[i] = append(rows[i], float64(percentile(samples, p))/1e3)
		}
	}
	for i, p := range pcts {
		name := fmt.Sprintf("latency_p%.0f", p)
		if p == 100 {
			name = "latency_max"
		}
		printResult(name, median(rows[i]), "us")
	}
	return nil
}

// idleCPU: harness.h's bench_idle_pct. A shell outside this process sums the run time of its
// threads in ns (/proc/PID/task/N/schedstat) settle after the call and again window later,
// while this goroutine waits for the answer without a timer of its own; both samples are
// printed at the end. The window's CPU time in percent of one core.
func idleCPU(settle, window time.Duration) (float64, error) {
	script := fmt.Sprintf(`s() { echo "$(date +%%s%%N) $(cat /proc/%d/task/*/schedstat |`+
		` awk '{s += $1} END {if (NR) printf "%%.0f", s}')"; };`+
		` sleep %.3f; a=$(s); sleep %.3f; b=$(s); echo "$a"; echo "$b"`,
		os.Getpid(), settle.Seconds(), window.Seconds())
	out, err := exec.Command("/bin/sh", "-c", script).Output()
	var t0, c0, t1, c1 uint64
	n, _ := fmt.Sscan(string(out), &t0, &c0, &t1, &c1)
	if err != nil || n != 4 || t1 <= t0 || c1 < c0 {
		return 0, fmt.Errorf("idle_cpu: could not read this process's CPU time from "+
			"/proc/%d/task/*/schedstat (%d of 4 numbers, %v)", os.Getpid(), n, err)
	}
	return 100 * float64(c1-c0) / float64(t1-t0), nil
}

// idle_cpu: idleActors actors each handle one message, then nothing happens for idleTime;
// process CPU time over that window in percent of one core, read from outside (idleCPU).
func benchIdleCPU() error {
	var wg sync.WaitGroup
	pokes := make([]uint64, idleActors)
	all := make([]mailbox, idleActors)
	for i := range all {
		self, p := newMailbox(), &pokes[i]
		all[i] = self
		spawn(&wg, func() {
			for range self {
				*p++
			}
		})
		self <- msg{kind: kPoke}
	}
	// 100 ms to let the pokes be handled and the threads go idle, then the window
	pct, err := idleCPU(100*time.Millisecond, idleTime)
	for _, x := range all {
		close(x)
	}
	wg.Wait()
	if err != nil {
		return err
	}
	fmt.Printf("idle_cpu: %.6f %%\n", pct) // six decimals: harness.h's bench_print_idle
	return nil
}

// --- harness: harness.h's, in Go -----------------------------------------------------------

type args struct {
	only    string
	reps    int
	workers int
}

// selected is bench_selected: when one of name and --only is a prefix of the other.
func (a *args) selected(name string) bool {
	return a.only == "" || strings.HasPrefix(name, a.only) || strings.HasPrefix(a.only, name)
}

func median(v []float64) float64 {
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// percentile is bench_percentile: nearest rank over v sorted ascending.
func percentile(v []uint64, p float64) uint64 {
	n := len(v)
	rank := int(p/100*float64(n) + 0.999999)
	switch {
	case rank == 0:
		return v[0]
	case rank > n:
		return v[n-1]
	}
	return v[rank-1]
}

func printResult(name string, value float64, unit string) {
	fmt.Printf("%s: %.3f %s\n", name, value, unit)
}

// timed runs fn a.reps times and prints the median as `name: X ms`.
func timed(a *args, name string, fn func() (float64, error)) error {
	ms := make([]float64, a.reps)
	for r := range ms {
		runtime.GC()
		var err error
		if ms[r], err = fn(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n%s: FAILED (wrong result)\n", name, err, name)
			return err
		}
	}
	printResult(name, median(ms), "ms")
	return nil
}

func main() {
	var a args
	flag.StringVar(&a.only, "only", "", "run only the benchmarks this names (a prefix either way)")
	flag.IntVar(&a.reps, "reps", 5, "repetitions of each timed and latency benchmark; medians are reported")
	flag.IntVar(&a.workers, "workers", 0, "GOMAXPROCS; 0 = online cores")
	flag.Parse()
	if flag.NArg() > 0 || a.reps < 1 || a.reps > maxReps {
		fmt.Fprintf(os.Stderr, "usage: %s [--only NAME] [--reps N (1..%d)] [--workers N]\n",
			os.Args[0], maxReps)
		os.Exit(2)
	}
	if a.workers <= 0 {
		a.workers = runtime.NumCPU()
	}
	runtime.GOMAXPROCS(a.workers)
	fmt.Printf("# go %s: GOMAXPROCS %d, median of %d reps\n", runtime.Version(), a.workers, a.reps)
	benches := []struct {
		name string
		fn   func() (float64, error)
	}{
		{"pingpong", benchPingpong}, {"counting", benchCounting},
		{"threadring", benchThreadring}, {"chameneos", benchChameneos}, {"big", benchBig},
		{"fjthrput", benchFjthrput}, {"fib", benchFib}, {"skynet", benchSkynet},
	}
	failed := false
	for _, b := range benches {
		if a.selected(b.name) && timed(&a, b.name, b.fn) != nil {
			failed = true
		}
	}
	if benchFanin(&a) != nil {
		failed = true
	}
	if a.selected("latency") && benchLatency(&a) != nil {
		failed = true
	}
	if a.selected("idle_cpu") && benchIdleCPU() != nil {
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}
