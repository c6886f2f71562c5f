// watchbench measures watch delivery to a grpc-go client, against cache_server or against etcd
// 3.4, with the same client code for both: N watch streams spread over connections and
// resources, a paced open-loop writer, and per-watcher checks that every acknowledged write of
// the watcher's resource arrives exactly once and in revision order. A third target, rest, is
// cache_server with the same writes and its watchers on the read-only Kubernetes view
// (--kube-api-listen) over HTTP/1.1 with net/http and encoding/json, as client-go watches.
//
//	watchbench --target=cache --addr=127.0.0.1:7070 --watchers=1000 --write-rate=100 --duration=15s
//	watchbench --target=etcd  --addr=127.0.0.1:2379 --watchers=1000 --write-rate=100 --duration=15s
//	watchbench --target=rest  --addr=127.0.0.1:7070 --rest-addr=127.0.0.1:7072 --watchers=1000
//	watchbench --summarize etcd-1.json cache-1.json ...   # side-by-side table of earlier runs
//
// bench/go_watch_bench.sh builds it, starts both servers and runs it against each. With
// --writer-process the writes come from a second process (writer.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"math/rand"
	"net"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

var (
	flagTarget          = flag.String("target", "cache", "cache (cache_server), rest (cache_server's writes, watches on its Kubernetes view) or etcd")
	flagAddr            = flag.String("addr", "127.0.0.1:7070", "host:port of the server's gRPC API (rest: the writes')")
	flagRestAddr        = flag.String("rest-addr", "", "rest: host:port of cache_server's Kubernetes view (--kube-api-listen)")
	flagRestRV          = flag.String("rest-resource-version", "0", "rest: the resourceVersion of each watch (with sendInitialEvents=true and resourceVersionMatch=NotOlderThan); \"\": none, as a client-go reflector's first watch-list")
	flagWatchers        = flag.Int("watchers", 1000, "watch streams")
	flagPerConn         = flag.Int("watchers-per-conn", 16, "watch streams per gRPC connection (HTTP/2 connection); rest: unused, every watch has an HTTP/1.1 connection of its own")
	flagResources       = flag.Int("resources", 1, "resources the watchers are spread over (watcher i watches resource i mod N); the writes go round-robin over them")
	flagWriteRate       = flag.Float64("write-rate", 100, "writes per second offered, paced open-loop")
	flagDuration        = flag.Duration("duration", 15*time.Second, "how long the writer writes")
	flagValueBytes      = flag.Int("value-bytes", 1024, "random ASCII per object (etcd: the value; cache_server: a spec string)")
	flagMaxOutstanding  = flag.Int("max-outstanding-writes", 256, "writes in flight at most; a write due while this many are in flight is skipped (and counted)")
	flagWriteConns      = flag.Int("write-conns", 2, "gRPC connections of the writer (not shared with watchers)")
	flagWriteTimeout    = flag.Duration("write-timeout", 10*time.Second, "deadline of each write")
	flagDialTimeout     = flag.Duration("dial-timeout", 10*time.Second, "deadline of each connection's dial")
	flagSetupTimeout    = flag.Duration("setup-timeout", 60*time.Second, "how long every watcher may take to be in place before the run is given up")
	flagSetupParallel   = flag.Int("setup-parallel", 200, "watch streams being opened at once during setup")
	flagDrainTimeout    = flag.Duration("drain-timeout", 30*time.Second, "after the last write, how long the watchers may take to receive every acknowledged write")
	flagBatch           = flag.Bool("batch-events", true, "cache_server: ask for several events per message when a watcher is behind (WatchRequest.batch_events); etcd batches by itself")
	flagJSONObjects     = flag.Bool("json-objects", false, "cache_server: ask for objects as JSON bytes (WatchRequest.json_objects) and read seq, sent and resourceVersion out of them without decoding the rest, as etcd's value is read")
	flagBookmarks       = flag.Bool("bookmarks", false, "ask for periodic bookmarks, as a client that resumes or watches for a silent stream does: cache_server's WatchRequest.allow_bookmarks, etcd's progress_notify (each received counts in \"bookmark messages /s\"); rest always asks (allowWatchBookmarks=true, which sendInitialEvents needs, as client-go's reflector sends it)")
	flagWindow          = flag.Int("initial-window-size", 0, "grpc-go per-stream HTTP/2 window in bytes (0: grpc-go's default, with its BDP estimation)")
	flagConnWindow      = flag.Int("initial-conn-window-size", 0, "grpc-go per-connection HTTP/2 window in bytes (0: grpc-go's default)")
	flagServerPid       = flag.Int("server-pid", 0, "the server's pid (on this machine): report its CPU per delivered event, its RSS and its busiest threads")
	flagJSON            = flag.String("json", "", "also write the figures to this file, for --summarize")
	flagCPUProfile      = flag.String("cpuprofile", "", "write a Go CPU profile of the client, from the first write to the end of the drain")
	flagLabel           = flag.String("label", "", "free text recorded with the figures (e.g. the round)")
	flagSummarize       = flag.Bool("summarize", false, "read the --json files named as arguments and print one side-by-side table (mean of rounds, ratio of cache_server, and of its REST view when there are runs of it, to etcd)")
	flagFreePorts       = flag.Int("free-ports", 0, "print this many free loopback TCP ports and exit")
	flagProbe           = flag.Duration("probe", 0, "wait up to this long for the server at --addr to answer a read, then exit (0 when it did)")
	flagWriterProcess   = flag.Bool("writer-process", false, "run the writer in a process of its own (this program again), so that the watchers' decoding cannot starve it; its CPU is then not in the client CPU figures")
	flagWriterOf        = flag.String("writer-of", "", "internal (--writer-process): be the writer process of this run")
	flagClockBase       = flag.Int64("clock-base", 0, "internal (--writer-process): the parent's start, Unix nanoseconds, which the writer's stamps count from")
	flagWaitStopTimeout = 10 * time.Second
)

func main() {
	flag.Parse()
	switch {
	case *flagSummarize:
		os.Exit(summarize(flag.Args()))
	case *flagFreePorts > 0:
		os.Exit(freePorts(*flagFreePorts))
	}
	var t target
	run := fmt.Sprintf("r%d-%06x", time.Now().Unix(), rand.New(rand.NewSource(time.Now().UnixNano())).Intn(1<<24))
	if *flagWriterOf != "" {
		run = *flagWriterOf
	}
	switch *flagTarget {
	case "cache", "cache_server":
		t = &cacheTarget{cluster: "bench-" + run, batch: *flagBatch, json: *flagJSONObjects, bookmarks: *flagBookmarks}
	case "rest":
		if *flagRestAddr == "" {
			fatalf("--target=rest needs --rest-addr (cache_server's --kube-api-listen)")
		}
		t = &restTarget{cacheTarget: cacheTarget{cluster: "bench-" + run}, base: "http://" + *flagRestAddr}
	case "etcd":
		t = &etcdTarget{run: run, progressNotify: *flagBookmarks}
	default:
		fatalf("--target=%q: want cache, rest or etcd", *flagTarget)
	}
	if *flagProbe > 0 {
		os.Exit(probe(t, *flagProbe))
	}
	if *flagWatchers < 1 || *flagPerConn < 1 || *flagResources < 1 || *flagWriteRate <= 0 ||
		*flagDuration <= 0 || *flagMaxOutstanding < 1 || *flagWriteConns < 1 || *flagValueBytes < 0 {
		fatalf("--watchers, --watchers-per-conn, --resources, --write-rate, --duration, --max-outstanding-writes and --write-conns must be positive")
	}
	// The program always ends by itself: past every phase's own bound, give up.
	budget := *flagDialTimeout + *flagSetupTimeout + *flagDuration + *flagWriteTimeout + *flagDrainTimeout + 2*flagWaitStopTimeout + 30*time.Second
	time.AfterFunc(budget, func() {
		fmt.Fprintf(os.Stderr, "watchbench: still running after %v, every bound passed; giving up\n", budget)
		os.Exit(3)
	})
	if *flagWriterOf != "" {
		os.Exit(runWriterProcess(t))
	}
	os.Exit(runBench(t, run))
}

func fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "watchbench: "+format+"\n", args...)
	os.Exit(2)
}

func dialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}
	if *flagWindow > 0 {
		opts = append(opts, grpc.WithInitialWindowSize(int32(*flagWindow)))
	}
	if *flagConnWindow > 0 {
		opts = append(opts, grpc.WithInitialConnWindowSize(int32(*flagConnWindow)))
	}
	return opts
}

func dial(addr string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), *flagDialTimeout)
	defer cancel()
	return grpc.DialContext(ctx, addr, dialOptions()...)
}

// dialAll makes n connections, 16 dials at a time. Each grpc.ClientConn has its own HTTP/2
// connection.
func dialAll(n int) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			conns[i], errs[i] = dial(*flagAddr)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			closeAll(conns)
			return nil, err
		}
	}
	return conns, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

func freePorts(n int) int {
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "watchbench:", err)
			return 1
		}
		ls = append(ls, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return 0
}

func probe(t target, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := grpc.DialContext(ctx, *flagAddr, grpc.WithInsecure(), grpc.WithBlock())
		if err == nil {
			err = t.probe(ctx, conn)
			conn.Close()
		}
		cancel()
		if err == nil {
			return 0
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "watchbench: %s at %s did not answer within %v: %v\n", t.name(), *flagAddr, limit, last)
	return 1
}

// writeLog is what the writer learnt: per resource, the revision of each acknowledged seq.
type writeLog struct {
	mu        sync.Mutex
	acked     []map[int64]int64 // by resource: seq -> revision
	latency   wideHistogram     // microseconds, acknowledged writes
	errors    map[string]int
	ackedN    atomic.Int64
	failedN   atomic.Int64
	ackedByRc []atomic.Int64 // acknowledged writes per resource, read during the drain
}

func newWriteLog(resources int) *writeLog {
	l := &writeLog{acked: make([]map[int64]int64, resources), errors: map[string]int{},
		ackedByRc: make([]atomic.Int64, resources)}
	for i := range l.acked {
		l.acked[i] = map[int64]int64{}
	}
	return l
}

// randomASCII is a pool of printable characters that values are cut from.
func randomASCII(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(b)
}

type sample struct {
	at         time.Time
	deliveries int64
	messages   int64
	bookmarks  int64
	clientCPU  float64
	serverCPU  float64
	threads    map[string]threadSample
}

func takeSample(ws []*watcher, serverPid string) sample {
	s := sample{at: time.Now()}
	for _, w := range ws {
		s.deliveries += w.events.Load()
		s.messages += w.messages.Load()
		s.bookmarks += w.bookmarks.Load()
	}
	s.clientCPU, _ = procCPUSeconds("self")
	if serverPid != "" {
		s.serverCPU, _ = procCPUSeconds(serverPid)
		s.threads = threadTicks(serverPid)
	}
	return s
}

func errorText(err error) string {
	if s, ok := status.FromError(err); ok {
		msg := s.Message()
		if len(msg) > 120 {
			msg = msg[:120] + "..."
		}
		return s.Code().String() + ": " + msg
	}
	return err.Error()
}

// httpWatches is a target whose watchers do not use gRPC connections (rest): runBench dials only
// the writer's, and hands each watcher a nil connection.
type httpWatches interface {
	watchConns(watchers int) int
}

func runBench(t target, run string) int {
	nw := *flagWatchers
	nconns := (nw + *flagPerConn - 1) / *flagPerConn
	overHTTP := false
	if h, ok := t.(httpWatches); ok {
		nconns = h.watchConns(nw)
		overHTTP = true
	}
	serverPid := ""
	if *flagServerPid > 0 {
		serverPid = strconv.Itoa(*flagServerPid)
		if !pidExists(serverPid) {
			fatalf("--server-pid=%s: no such process", serverPid)
		}
	}
	res := &result{Target: t.name(), Command: strings.Join(os.Args, " "), Label: *flagLabel, Run: run}
	if overHTTP {
		fmt.Printf("watchbench: %s: writes to %s, %d watchers on %s, each on its own HTTP/1.1 connection, %d resource(s), %g writes/s offered for %v, values of %d bytes\n",
			t.name(), *flagAddr, nw, *flagRestAddr, *flagResources, *flagWriteRate, *flagDuration, *flagValueBytes)
	} else {
		fmt.Printf("watchbench: %s at %s: %d watchers on %d connections (%d per connection), %d resource(s), %g writes/s offered for %v, values of %d bytes\n",
			t.name(), *flagAddr, nw, nconns, *flagPerConn, *flagResources, *flagWriteRate, *flagDuration, *flagValueBytes)
	}

	watchConns, err := dialAll(nconns)
	if err != nil {
		fatalf("dial %s: %v", *flagAddr, err)
	}
	defer closeAll(watchConns)
	var writeConns []*grpc.ClientConn
	if !*flagWriterProcess {
		writeConns, err = dialAll(*flagWriteConns)
		if err != nil {
			fatalf("dial %s: %v", *flagAddr, err)
		}
		defer closeAll(writeConns)
	}

	// Watchers. Every stream's context has a deadline past the end of the run.
	streamLimit := *flagSetupTimeout + *flagDuration + *flagWriteTimeout + *flagDrainTimeout + flagWaitStopTimeout
	runCtx, stopWatchers := context.WithTimeout(context.Background(), streamLimit)
	defer stopWatchers()
	var stopping atomic.Bool
	ws := make([]*watcher, nw)
	var ready, failed atomic.Int64
	setupSem := make(chan struct{}, *flagSetupParallel)
	var wg sync.WaitGroup
	setupStart := time.Now()
	for i := range ws {
		w := &watcher{id: i, resource: i % *flagResources, conn: i / *flagPerConn}
		ws[i] = w
		var conn *grpc.ClientConn
		if !overHTTP {
			conn = watchConns[w.conn]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			setupSem <- struct{}{}
			released := false
			release := func() {
				if !released {
					released = true
					<-setupSem
				}
			}
			err := t.watch(runCtx, conn, w, func() { ready.Add(1); release() })
			if !released {
				failed.Add(1)
			}
			release()
			w.mu.Lock()
			if !stopping.Load() {
				w.err = err
			}
			w.mu.Unlock()
			w.done.Store(true)
		}()
	}
	for ready.Load()+failed.Load() < int64(nw) && time.Since(setupStart) < *flagSetupTimeout {
		time.Sleep(20 * time.Millisecond)
	}
	setupTime := time.Since(setupStart)
	if ready.Load() < int64(nw) {
		stopping.Store(true)
		fmt.Printf("watchbench: only %d of %d watchers in place after %v (%d failed); giving up\n",
			ready.Load(), nw, setupTime.Round(time.Millisecond), failed.Load())
		for _, w := range ws {
			w.mu.Lock()
			if w.err != nil {
				fmt.Printf("  first error: %s\n", errorText(w.err))
				w.mu.Unlock()
				break
			}
			w.mu.Unlock()
		}
		return 1
	}
	fmt.Printf("watchbench: %d watchers in place after %v\n", nw, setupTime.Round(time.Millisecond))

	// Server memory, sampled through the run.
	var peakRSS atomic.Int64
	samplerDone := make(chan struct{})
	var samplerWG sync.WaitGroup
	if serverPid != "" {
		samplerWG.Add(1)
		go func() {
			defer samplerWG.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				if kib, err := procStatusKiB(serverPid, "VmRSS"); err == nil && kib > peakRSS.Load() {
					peakRSS.Store(kib)
				}
				select {
				case <-samplerDone:
					return
				case <-tick.C:
				}
			}
		}()
	}

	if *flagCPUProfile != "" {
		f, err := os.Create(*flagCPUProfile)
		if err != nil {
			fatalf("--cpuprofile: %v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatalf("--cpuprofile: %v", err)
		}
		defer f.Close()
	}

	// The writer: open loop, paced; a write that falls due while --max-outstanding-writes are in
	// flight is skipped. In this process, or with --writer-process in one of its own.
	log := newWriteLog(*flagResources)
	loadAvgStart := loadAvg()
	s0 := takeSample(ws, serverPid)
	var s1 sample
	sentAll := func() { s1 = takeSample(ws, serverPid) }
	var sent, skipped int64
	if *flagWriterProcess {
		sent, skipped = writeInAnotherProcess(run, log, sentAll)
	} else {
		sent, skipped = writeLoop(t, writeConns, log, s0.at, sentAll)
	}
	writesEnd := time.Now()

	// The drain: until every watcher still open has every acknowledged write of its resource.
	drainDeadline := time.Now().Add(*flagDrainTimeout)
	drained := false
	for !drained && time.Now().Before(drainDeadline) {
		drained = true
		for _, w := range ws {
			if !w.done.Load() && w.distinct.Load() < log.ackedByRc[w.resource].Load() {
				drained = false
				break
			}
		}
		if !drained {
			time.Sleep(20 * time.Millisecond)
		}
	}
	s2 := takeSample(ws, serverPid)
	loadAvgEnd := loadAvg()
	drainTime := s2.at.Sub(s1.at)
	if *flagCPUProfile != "" {
		pprof.StopCPUProfile()
	}
	close(samplerDone)
	samplerWG.Wait()
	var rssEnd, hwm int64
	if serverPid != "" {
		rssEnd, _ = procStatusKiB(serverPid, "VmRSS")
		hwm, _ = procStatusKiB(serverPid, "VmHWM")
	}

	stopping.Store(true)
	stopWatchers()
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(flagWaitStopTimeout):
		fmt.Printf("watchbench: some watchers did not stop within %v\n", flagWaitStopTimeout)
	}

	// Checks and figures.
	var lat wideHistogram
	var missing, dups, disorder, unexpected, initial, unacked int64
	var errored, late1s, late100ms int
	errs := map[string]int{}
	oddities := map[string]int{}
	for _, w := range ws {
		w.mu.Lock()
		lat.merge(&w.latency)
		dups += w.duplicates
		disorder += w.outOfOrder
		unexpected += w.unexpectedN
		initial += w.initial
		if w.firstOddity != "" {
			oddities[w.firstOddity]++
		}
		if w.err != nil {
			errored++
			errs[errorText(w.err)]++
		}
		if w.maxLatencyNs > int64(time.Second) {
			late1s++
		}
		if w.maxLatencyNs > int64(100*time.Millisecond) {
			late100ms++
		}
		acked := log.acked[w.resource]
		for seq := range acked {
			if !w.hasSeen(seq) {
				missing++
			}
		}
		for seq := 1; seq < len(w.seen); seq++ {
			if w.seen[seq] {
				if _, ok := acked[int64(seq)]; !ok {
					unacked++
				}
			}
		}
		w.mu.Unlock()
	}
	var expected int64
	for _, w := range ws {
		expected += int64(len(log.acked[w.resource]))
	}

	window := s1.at.Sub(s0.at).Seconds()
	whole := s2.at.Sub(s0.at).Seconds()
	delivered := s2.deliveries - s0.deliveries
	ms := func(us int64) float64 { return float64(us) / 1000 }
	res.add("writes_offered", "writes offered", float64(sent+skipped), "%.0f")
	res.add("writes_skipped", "writes skipped (max outstanding reached)", float64(skipped), "%.0f")
	res.add("writes_failed", "writes failed", float64(log.failedN.Load()), "%.0f")
	res.add("writes_per_s", "writes acknowledged /s", float64(log.ackedN.Load())/window, "%.1f")
	res.add("write_p50_ms", "write latency p50 ms", ms(log.latency.quantile(0.5)), "%.2f")
	res.add("write_p99_ms", "write latency p99 ms", ms(log.latency.quantile(0.99)), "%.2f")
	res.add("deliveries_per_s", "deliveries /s (while writing)", float64(s1.deliveries-s0.deliveries)/window, "%.0f")
	res.add("deliveries", "deliveries (whole run)", float64(delivered), "%.0f")
	res.add("deliveries_expected", "deliveries expected (acknowledged writes x their watchers)", float64(expected), "%.0f")
	res.add("drain_s", "time from the last write sent to the last delivery s", drainTime.Seconds(), "%.2f")
	res.add("delivery_p50_ms", "delivery latency p50 ms", ms(lat.quantile(0.5)), "%.2f")
	res.add("delivery_p99_ms", "delivery latency p99 ms", ms(lat.quantile(0.99)), "%.2f")
	res.add("delivery_max_ms", "delivery latency max ms", ms(lat.max), "%.2f")
	msgs := s2.messages - s0.messages
	if msgs > 0 {
		res.add("events_per_message", "events per message (messages with events)", float64(delivered)/float64(msgs), "%.2f")
	}
	res.add("bookmarks_per_s", "bookmark messages /s", float64(s2.bookmarks-s0.bookmarks)/whole, "%.0f")
	res.add("watchers_errored", "watchers ended with an error", float64(errored), "%.0f")
	res.add("watchers_late_1s", "watchers ever more than 1 s behind", float64(late1s), "%.0f")
	res.add("watchers_late_100ms", "watchers ever more than 100 ms behind", float64(late100ms), "%.0f")
	res.add("missing", "missing events (acknowledged, never delivered)", float64(missing), "%.0f")
	res.add("duplicates", "duplicate events", float64(dups), "%.0f")
	res.add("out_of_order", "out-of-order events (revision not above the previous)", float64(disorder), "%.0f")
	if unacked > 0 {
		res.add("delivered_unacked", "delivered writes whose acknowledgement failed", float64(unacked), "%.0f")
	}
	if unexpected+initial > 0 {
		res.add("unexpected", "unexpected events", float64(unexpected+initial), "%.0f")
	}
	perEvent := func(cpu float64) float64 {
		if delivered == 0 {
			return 0
		}
		return cpu / float64(delivered) * 1e6
	}
	res.add("client_cpu_cores", "client CPU cores", (s2.clientCPU-s0.clientCPU)/whole, "%.2f")
	res.add("client_cpu_us_per_event", "client CPU us per delivered event", perEvent(s2.clientCPU-s0.clientCPU), "%.2f")
	if serverPid != "" {
		res.add("server_cpu_cores", "server CPU cores", (s2.serverCPU-s0.serverCPU)/whole, "%.2f")
		res.add("server_cpu_us_per_event", "server CPU us per delivered event", perEvent(s2.serverCPU-s0.serverCPU), "%.2f")
		res.add("server_rss_peak_mib", "server RSS MiB, peak during the run", float64(peakRSS.Load())/1024, "%.0f")
		res.add("server_rss_end_mib", "server RSS MiB at the end", float64(rssEnd)/1024, "%.0f")
		res.add("server_hwm_mib", "server VmHWM MiB (since it started)", float64(hwm)/1024, "%.0f")
		threads, groups := busiestThreads(s0.threads, s2.threads, whole, 6)
		res.note("server threads (cores)", threads)
		res.note("server threads by name (cores)", groups)
	}
	res.note("load average", fmt.Sprintf("%s at the first write, %s at the end", loadAvgStart, loadAvgEnd))
	res.note("setup", fmt.Sprintf("%d watchers in place in %.1f s", nw, setupTime.Seconds()))
	res.note("window", fmt.Sprintf("writes %.2f s, writes answered %.2f s after the first, drain to %.2f s; CPU and per-event figures over the whole %.2f s",
		window, writesEnd.Sub(s0.at).Seconds(), whole, whole))
	for _, kv := range topCounts(log.errors, 3) {
		res.note("write error", kv)
	}
	for _, kv := range topCounts(errs, 3) {
		res.note("watcher error", kv)
	}
	for _, kv := range topCounts(oddities, 3) {
		res.note("unexpected", kv)
	}
	verified := missing == 0 && dups == 0 && disorder == 0 && errored == 0 && unexpected == 0 && initial == 0
	if verified {
		res.note("verified", "every watcher received every acknowledged write of its resource once, in revision order")
	} else {
		res.note("verified", "NO: see the missing, duplicate, out-of-order, unexpected and error counts")
	}
	res.print(os.Stdout)
	if *flagJSON != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := ioutil.WriteFile(*flagJSON, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "watchbench: --json:", err)
			return 1
		}
	}
	return 0
}

func topCounts(m map[string]int, n int) []string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var out []string
	for i, e := range all {
		if i == n {
			break
		}
		out = append(out, fmt.Sprintf("%d x %s", e.v, e.k))
	}
	return out
}

// loadAvg is the one-minute load average of the machine.
func loadAvg() string {
	data, err := ioutil.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}
