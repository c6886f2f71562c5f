package main

import (
	"sync"
	"sync/atomic"
)

// watcher is the state of one watch stream. Its goroutine (in target.watch) feeds it one message
// at a time: beginMessage, observe for each event, endMessage. The counters read while the run is
// going on are atomic; the rest is read once the watcher's goroutine has ended, or under mu.
type watcher struct {
	id       int
	resource int
	conn     int

	events    atomic.Int64 // deliveries of this run's writes, duplicates included
	distinct  atomic.Int64 // distinct writes delivered
	messages  atomic.Int64 // messages that carried at least one of this run's writes
	bookmarks atomic.Int64 // bookmarks (etcd: progress notifications) received, initial-events-end excluded
	done      atomic.Bool  // the stream has ended

	mu           sync.Mutex
	msgHasEvent  bool
	seen         []bool // by seq (writes of one resource are numbered 1, 2, ...)
	lastRev      int64
	duplicates   int64
	outOfOrder   int64
	initial      int64 // initial events (none expected: each run has its own objects)
	unexpectedN  int64
	firstOddity  string
	latency      histogram // microseconds, receive time - send time
	maxLatencyNs int64
	err          error
}

func (w *watcher) beginMessage() {
	w.mu.Lock()
	w.msgHasEvent = false
}

func (w *watcher) endMessage() {
	if w.msgHasEvent {
		w.messages.Add(1)
	}
	w.mu.Unlock()
}

func (w *watcher) bookmark() { w.bookmarks.Add(1) }

// observe records one delivered write: seq, its send time and revision, and the receive time.
// Called between beginMessage and endMessage.
func (w *watcher) observe(seq, sentNanos, rev, nowNanos int64) {
	w.events.Add(1)
	w.msgHasEvent = true
	if rev <= w.lastRev {
		w.outOfOrder++
	} else {
		w.lastRev = rev
	}
	if seq <= 0 || seq > 1<<40 {
		w.oddity("seq out of range")
		return
	}
	for int64(len(w.seen)) <= seq {
		n := 2 * len(w.seen)
		if n < 64 {
			n = 64
		}
		grown := make([]bool, n)
		copy(grown, w.seen)
		w.seen = grown
	}
	if w.seen[seq] {
		w.duplicates++
	} else {
		w.seen[seq] = true
		w.distinct.Add(1)
	}
	lat := nowNanos - sentNanos
	if lat > w.maxLatencyNs {
		w.maxLatencyNs = lat
	}
	w.latency.add(lat / 1000)
}

func (w *watcher) initialEvent() { w.initial++ }

func (w *watcher) unexpected(what string) { w.oddity(what) }

func (w *watcher) oddity(what string) {
	w.unexpectedN++
	if w.firstOddity == "" {
		w.firstOddity = what
	}
}

func (w *watcher) hasSeen(seq int64) bool {
	return seq < int64(len(w.seen)) && w.seen[seq]
}
