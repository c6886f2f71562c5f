package main

// The rest target's decoding and stream reading, against lines shaped as cache_server's
// Kubernetes view writes them (cache_server/kube_json.cc), and the cost of decoding one:
//
//	GO111MODULE=off GOPATH=build-gowatch/gopath:/usr/share/gocode go test -run Rest -bench=Rest -benchmem

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// restObjectLine is an ADDED event of one of watchbench's objects, as the view writes it.
func restObjectLine(typ string, seq, rev int64, value string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"apiVersion":"bench.shardcache.io/v1","kind":"Widget",`+
		`"metadata":{"name":"w-%d","namespace":"default","uid":"0f8fad5b-d9cb-469f-a165-70867728950e",`+
		`"resourceVersion":"%d","generation":1,"creationTimestamp":"2026-12-06T04:00:00Z",`+
		`"annotations":{"kcp.io/cluster":"bench-r1764928000-abcdef","kcp.io/shard":"root"}},`+
		`"spec":{"seq":"%d","sent":"%d","value":%q}}}`+"\n", typ, seq, rev, seq, 1000+seq, value)
}

const restInitialEnd = `{"type":"BOOKMARK","object":{"kind":"Widget","apiVersion":"bench.shardcache.io/v1",` +
	`"metadata":{"resourceVersion":"41","annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n"

const restBookmark = `{"type":"BOOKMARK","object":{"kind":"Widget","apiVersion":"bench.shardcache.io/v1",` +
	`"metadata":{"resourceVersion":"99"}}}` + "\n"

func TestDecodeRestEvent(t *testing.T) {
	var ev restEvent
	if err := decodeRestEvent([]byte(restObjectLine("ADDED", 7, 48, "xyz")), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "ADDED" || ev.Object.Spec.Seq != "7" || ev.Object.Spec.Sent != "1007" ||
		ev.Object.Metadata.ResourceVersion != "48" || ev.Object.Metadata.Annotations.InitialEventsEnd != "" {
		t.Fatalf("object: %+v", ev)
	}
	if err := decodeRestEvent([]byte(restInitialEnd), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "BOOKMARK" || ev.Object.Metadata.Annotations.InitialEventsEnd != "true" || ev.Object.Spec.Seq != "" {
		t.Fatalf("bookmark (the fields of the previous line must not stay): %+v", ev)
	}
	status := `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",` +
		`"message":"too old resource version","reason":"Expired","code":410}}`
	if err := decodeRestEvent([]byte(status), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "ERROR" || ev.Object.Message != "too old resource version" {
		t.Fatalf("status: %+v", ev)
	}
}

// TestRestWatch runs restTarget.watch against a stand-in for the view: the path and parameters
// it asks for, ready at the initial-events-end bookmark, each write observed once, the lines of
// one flush counted as one message, a later bookmark counted, a line longer than the read buffer,
// and an ERROR event ending the watch with its message.
func TestRestWatch(t *testing.T) {
	long := strings.Repeat("v", 200<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := "/clusters/bench-x/apis/bench.shardcache.io/v1/widgets"
		q := r.URL.Query()
		if r.URL.Path != want || q.Get("watch") != "true" || q.Get("sendInitialEvents") != "true" ||
			q.Get("resourceVersionMatch") != "NotOlderThan" || q.Get("allowWatchBookmarks") != "true" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusBadRequest)
			return
		}
		flush := w.(http.Flusher).Flush
		fmt.Fprint(w, restInitialEnd)
		flush()
		time.Sleep(20 * time.Millisecond)
		fmt.Fprint(w, restObjectLine("ADDED", 1, 50, "a")+restObjectLine("ADDED", 2, 51, "b"))
		flush()
		time.Sleep(20 * time.Millisecond)
		fmt.Fprint(w, restBookmark)
		fmt.Fprint(w, restObjectLine("ADDED", 3, 52, long))
		flush()
		time.Sleep(20 * time.Millisecond)
		fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","message":"watcher too slow"}}`+"\n")
	}))
	defer srv.Close()

	tg := &restTarget{cacheTarget: cacheTarget{cluster: "bench-x"}, base: srv.URL}
	w := &watcher{}
	readies := 0
	err := tg.watch(context.Background(), nil, w, func() { readies++ })
	if err == nil || !strings.Contains(err.Error(), "watcher too slow") {
		t.Fatalf("watch ended with %v, want the ERROR event's message", err)
	}
	if readies != 1 {
		t.Fatalf("ready called %d times", readies)
	}
	if w.events.Load() != 3 || w.distinct.Load() != 3 || w.duplicates != 0 || w.outOfOrder != 0 ||
		w.unexpectedN != 0 || w.initial != 0 {
		t.Fatalf("watcher: events %d distinct %d duplicates %d out of order %d unexpected %d (%s) initial %d",
			w.events.Load(), w.distinct.Load(), w.duplicates, w.outOfOrder, w.unexpectedN, w.firstOddity, w.initial)
	}
	if w.bookmarks.Load() != 1 {
		t.Fatalf("bookmarks %d, want 1", w.bookmarks.Load())
	}
	// The first two writes came in one flush: at most 2 messages with writes (3 if the
	// connection split the flush).
	if m := w.messages.Load(); m < 2 || m > 3 {
		t.Fatalf("messages with writes %d, want 2 (or 3)", m)
	}
}

// The client's cost to decode one event line of the view into restEvent, as the rest target
// does for every line.
func BenchmarkDecodeRest(b *testing.B) {
	line := []byte(restObjectLine("ADDED", 12345, 67890, randomASCII(1024)))
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	var ev restEvent
	for i := 0; i < b.N; i++ {
		if err := decodeRestEvent(line, &ev); err != nil || ev.Object.Spec.Seq != "12345" {
			b.Fatal(err)
		}
	}
}
