package main

// The writer: an open loop of paced writes, in this process or, with --writer-process, in a
// process of its own (this program again, with --writer-of), so that a watch client that uses
// every core it is given (1,000 watchers decoding JSON) does not starve it: in one process the
// writes fall behind the watchers' goroutines, and what is measured is the client's scheduler.
// The writer process stamps each write with the parent's clock (--clock-base: the parent's
// start, on the wall clock), reports "writes-done" on its stdout when the last write is sent,
// and at the end one "writer-report" line: every acknowledged seq and revision, the latencies,
// the errors. Its CPU is not the client's CPU of the figures (that is the watchers').

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// writeLoop sends --write-rate writes a second for --duration from `start`, skipping a write
// that falls due while --max-outstanding-writes are in flight, and records what each answered
// in `log`. It returns once every write has been answered (each within --write-timeout), with
// the writes sent and skipped; `sentAll` is called when the last one has been sent.
func writeLoop(t target, writeConns []*grpc.ClientConn, log *writeLog, start time.Time, sentAll func()) (sent, skipped int64) {
	pool := randomASCII(1<<20 + *flagValueBytes)
	nextSeq := make([]int64, *flagResources)
	inflight := make(chan struct{}, *flagMaxOutstanding)
	var writers sync.WaitGroup
	rnd := rand.New(rand.NewSource(1))
	for i := int64(0); ; i++ {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / *flagWriteRate))
		if due.Sub(start) >= *flagDuration {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		select {
		case inflight <- struct{}{}:
		default:
			skipped++
			continue
		}
		r := int(i % int64(*flagResources))
		nextSeq[r]++
		seq := nextSeq[r]
		off := rnd.Intn(1 << 20)
		value := pool[off : off+*flagValueBytes]
		conn := writeConns[int(sent)%len(writeConns)]
		sent++
		writers.Add(1)
		go func() {
			defer writers.Done()
			defer func() { <-inflight }()
			ctx, cancel := context.WithTimeout(context.Background(), *flagWriteTimeout)
			defer cancel()
			start := monoNanos()
			rev, err := t.write(ctx, conn, r, seq, start, value)
			took := monoNanos() - start
			log.record(r, seq, rev, took/1000, err)
		}()
	}
	sentAll()
	writers.Wait() // bounded by --write-timeout
	return sent, skipped
}

// record notes one write's answer: its revision, or its error.
func (l *writeLog) record(resource int, seq, rev, latencyUs int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failedN.Add(1)
		l.errors[errorText(err)]++
		return
	}
	l.acked[resource][seq] = rev
	l.ackedByRc[resource].Add(1)
	l.ackedN.Add(1)
	l.latency.add(latencyUs)
}

// writerReport is what the writer process tells its parent at the end.
type writerReport struct {
	Acked   []map[int64]int64 `json:"acked"` // by resource: seq -> revision
	Counts  []uint64          `json:"latency_counts"`
	N       uint64            `json:"latency_n"`
	Max     int64             `json:"latency_max"`
	Errors  map[string]int    `json:"errors"`
	Failed  int64             `json:"failed"`
	Sent    int64             `json:"sent"`
	Skipped int64             `json:"skipped"`
}

const (
	writesDoneLine   = "writes-done"
	writerReportLine = "writer-report "
)

// runWriterProcess is the writer process's main: it writes and reports on stdout.
func runWriterProcess(t target) int {
	processStart = time.Unix(0, *flagClockBase)
	writeConns, err := dialAll(*flagWriteConns)
	if err != nil {
		fatalf("writer: dial %s: %v", *flagAddr, err)
	}
	defer closeAll(writeConns)
	log := newWriteLog(*flagResources)
	sent, skipped := writeLoop(t, writeConns, log, time.Now(), func() { fmt.Println(writesDoneLine) })
	log.mu.Lock()
	report := writerReport{Acked: log.acked, Counts: log.latency.counts, N: log.latency.n,
		Max: log.latency.max, Errors: log.errors, Failed: log.failedN.Load(), Sent: sent, Skipped: skipped}
	log.mu.Unlock()
	data, err := json.Marshal(report)
	if err != nil {
		fatalf("writer: %v", err)
	}
	fmt.Println(writerReportLine + string(data))
	return 0
}

// writeInAnotherProcess runs the writer process of run `run` and merges its report into `log`;
// `sentAll` is called when it has sent its last write.
func writeInAnotherProcess(run string, log *writeLog, sentAll func()) (sent, skipped int64) {
	args := append([]string{}, os.Args[1:]...)
	args = append(args, "--writer-of="+run, fmt.Sprintf("--clock-base=%d", processStart.UnixNano()),
		"--json=", "--cpuprofile=", "--server-pid=0")
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatalf("writer process: %v", err)
	}
	if err := cmd.Start(); err != nil {
		fatalf("writer process: %v", err)
	}
	var report *writerReport
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<30)
	done := false
	for lines.Scan() {
		line := lines.Text()
		switch {
		case line == writesDoneLine && !done:
			done = true
			sentAll()
		case strings.HasPrefix(line, writerReportLine):
			report = &writerReport{}
			if err := json.Unmarshal([]byte(line[len(writerReportLine):]), report); err != nil {
				fatalf("writer process: its report: %v", err)
			}
		}
	}
	if err := cmd.Wait(); err != nil || report == nil {
		fatalf("writer process: %v (report: %v)", err, report != nil)
	}
	if !done {
		sentAll()
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for r, acked := range report.Acked {
		if r >= len(log.acked) {
			break
		}
		log.acked[r] = acked
		log.ackedByRc[r].Store(int64(len(acked)))
		log.ackedN.Add(int64(len(acked)))
	}
	log.latency = wideHistogram{counts: report.Counts, n: report.N, max: report.Max}
	for k, v := range report.Errors {
		log.errors[k] += v
	}
	log.failedN.Add(report.Failed)
	return report.Sent, report.Skipped
}
