package main

import (
	"fmt"
	"io/ioutil"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// histogram counts non-negative values (microseconds) in log-linear buckets: exact below 64,
// then 32 buckets per power of two (at most about 3 % wide). It grows only as far as the largest
// value seen, so that 10,000 per-watcher histograms stay small.
type histogram struct {
	counts []uint32
	n      uint64
	max    int64
}

func bucketOf(v int64) int {
	if v < 64 {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 6
	return e*32 + int(v>>uint(e))
}

// bucketMid is a value inside bucket b (its middle).
func bucketMid(b int) int64 {
	if b < 64 {
		return int64(b)
	}
	e := (b - 32) / 32
	m := int64(b - e*32)
	lo := m << uint(e)
	hi := ((m + 1) << uint(e)) - 1
	return (lo + hi) / 2
}

func (h *histogram) add(v int64) {
	b := bucketOf(v)
	if b >= len(h.counts) {
		n := b + 1 + 32
		grown := make([]uint32, n)
		copy(grown, h.counts)
		h.counts = grown
	}
	h.counts[b]++
	h.n++
	if v > h.max {
		h.max = v
	}
}

// wideHistogram is the sum of many histograms (counts that a uint32 may not hold).
type wideHistogram struct {
	counts []uint64
	n      uint64
	max    int64
}

func (w *wideHistogram) merge(o *histogram) {
	if len(o.counts) > len(w.counts) {
		grown := make([]uint64, len(o.counts))
		copy(grown, w.counts)
		w.counts = grown
	}
	for i, c := range o.counts {
		w.counts[i] += uint64(c)
	}
	w.n += o.n
	if o.max > w.max {
		w.max = o.max
	}
}

func (w *wideHistogram) add(v int64) {
	b := bucketOf(v)
	if b >= len(w.counts) {
		grown := make([]uint64, b+1+32)
		copy(grown, w.counts)
		w.counts = grown
	}
	w.counts[b]++
	w.n++
	if v > w.max {
		w.max = v
	}
}

// quantile returns the value at quantile q (0..1); the maximum is exact.
func (w *wideHistogram) quantile(q float64) int64 {
	if w.n == 0 {
		return 0
	}
	if q >= 1 {
		return w.max
	}
	rank := uint64(q*float64(w.n-1)) + 1
	var seen uint64
	for b, c := range w.counts {
		seen += c
		if seen >= rank {
			v := bucketMid(b)
			if v > w.max {
				v = w.max
			}
			return v
		}
	}
	return w.max
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100 on Linux for every
// architecture Go runs on (sysconf(_SC_CLK_TCK) would need cgo).
const clockTicks = 100

// procCPUSeconds reads utime+stime of a process ("self" or a pid) from /proc/PID/stat.
func procCPUSeconds(pid string) (float64, error) {
	data, err := ioutil.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	_, ticks, err := parseStat(string(data))
	if err != nil {
		return 0, err
	}
	return float64(ticks) / clockTicks, nil
}

// parseStat returns the command name and utime+stime (ticks) of one /proc/.../stat line.
func parseStat(s string) (string, int64, error) {
	open := strings.IndexByte(s, '(')
	end := strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("malformed stat line")
	}
	comm := s[open+1 : end]
	fields := strings.Fields(s[end+1:])
	// fields[0] is the state (field 3); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return "", 0, fmt.Errorf("short stat line")
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, fmt.Errorf("malformed utime/stime")
	}
	return comm, ut + st, nil
}

// procStatusKiB reads a "Key:   N kB" line (VmRSS, VmHWM) of /proc/PID/status.
func procStatusKiB(pid, key string) (int64, error) {
	data, err := ioutil.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, key+":") {
			f := strings.Fields(line[len(key)+1:])
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%s/status", key, pid)
}

// threadTicks reads utime+stime of every thread of a process, by thread id.
type threadSample struct {
	comm  string
	ticks int64
}

func threadTicks(pid string) map[string]threadSample {
	out := map[string]threadSample{}
	dir := filepath.Join("/proc", pid, "task")
	entries, err := ioutil.ReadDir(dir)
	if err != nil {
		return out
	}
	for _, e := range entries {
		data, err := ioutil.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		comm, ticks, err := parseStat(string(data))
		if err != nil {
			continue
		}
		out[e.Name()] = threadSample{comm, ticks}
	}
	return out
}

// busiestThreads names the threads that used the most CPU between two samples, as
// "name (tid) cores", busiest first, and the CPU of all threads of each name.
func busiestThreads(before, after map[string]threadSample, seconds float64, n int) (string, string) {
	type row struct {
		name  string
		cores float64
	}
	var rows []row
	byName := map[string]float64{}
	for tid, a := range after {
		b := before[tid] // a thread born in between starts from zero
		d := float64(a.ticks-b.ticks) / clockTicks / seconds
		if d <= 0 {
			continue
		}
		rows = append(rows, row{fmt.Sprintf("%s[%s]", a.comm, tid), d})
		byName[a.comm] += d
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].cores > rows[j].cores })
	var parts []string
	for i, r := range rows {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", r.name, r.cores))
	}
	var names []row
	for k, v := range byName {
		names = append(names, row{k, v})
	}
	sort.Slice(names, func(i, j int) bool { return names[i].cores > names[j].cores })
	var groups []string
	for i, r := range names {
		if i == n {
			break
		}
		groups = append(groups, fmt.Sprintf("%s %.2f", r.name, r.cores))
	}
	return strings.Join(parts, ", "), strings.Join(groups, ", ")
}

func pidExists(pid string) bool {
	_, err := os.Stat(filepath.Join("/proc", pid, "stat"))
	return err == nil
}
