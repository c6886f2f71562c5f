package main

// The rest target: cache_server's load with the watchers on its read-only Kubernetes view
// (cache_server --kube-api-listen) instead of the Store service, as a client-go reflector watches
// kube-apiserver. Writes are the cache target's (unary Create over gRPC), so delivery latency and
// the exactly-once checks compare directly with the cache and etcd targets.
//
// A watcher is one GET .../{resource}?watch=true over HTTP/1.1 with net/http, on a connection of
// its own (an HTTP/1.1 connection carries one response at a time, and a watch's response lasts
// the whole run): a chunked stream of JSON lines {"type":...,"object":{...}}, each decoded with
// encoding/json into restEvent, which holds only what the watcher needs.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"io/ioutil"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

type restTarget struct {
	// The writes, and the logical cluster of this run's objects: the watch path is prefixed with
	// /clusters/{cluster}, so that a watcher sees only this run's objects.
	cacheTarget
	// base is "http://host:port" of the Kubernetes view.
	base string

	once   sync.Once
	client *http.Client
}

func (t *restTarget) name() string { return "cache_server_rest" }

// httpClient is shared by every watcher, as the watches of one client-go clientset share one
// http.Transport. Plain http:// never negotiates HTTP/2 (no h2c); TLSNextProto set to an empty
// map says so anyway. Each watch holds its connection for the whole run, so the pool grows to one
// connection per watcher: no limit per host. No compression: kube-apiserver does not compress
// watch responses, and the view's cost should not hide behind gzip's.
func (t *restTarget) httpClient() *http.Client {
	t.once.Do(func() {
		dialer := &net.Dialer{Timeout: *flagDialTimeout, KeepAlive: 30 * time.Second}
		t.client = &http.Client{Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			MaxConnsPerHost:       0, // no limit
			DisableCompression:    true,
			ForceAttemptHTTP2:     false,
			TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
			ResponseHeaderTimeout: *flagSetupTimeout,
		}}
	})
	return t.client
}

// watchURL is the watch of resource i in this run's logical cluster, with the initial events
// (none: the cluster is new) ended by a bookmark annotated k8s.io/initial-events-end, as a
// client-go reflector asks for them with the WatchList feature. --rest-resource-version is 0 by
// default ("any state at least this new", as a reflector that may start from a cache asks);
// a reflector's first watch-list has none, which the view does not accept yet.
func (t *restTarget) watchURL(i int) string {
	q := url.Values{}
	q.Set("watch", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("sendInitialEvents", "true")
	q.Set("resourceVersionMatch", "NotOlderThan")
	if *flagRestRV != "" {
		q.Set("resourceVersion", *flagRestRV)
	}
	return t.base + "/clusters/" + url.PathEscape(t.cluster) + "/apis/" + benchGroup + "/v1/" +
		resourceName(i) + "?" + q.Encode()
}

// restEvent is one watch line, decoded as far as the watcher needs it. An ERROR event's object
// is a Status: its message lands in Object.Message.
type restEvent struct {
	Type   string `json:"type"`
	Object struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
			Annotations     struct {
				InitialEventsEnd string `json:"k8s.io/initial-events-end"`
			} `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Seq  string `json:"seq"`
			Sent string `json:"sent"`
		} `json:"spec"`
		Message string `json:"message"`
	} `json:"object"`
}

// decodeRestEvent decodes one line into ev (reset first: encoding/json leaves the fields that a
// line does not have as they were).
func decodeRestEvent(line []byte, ev *restEvent) error {
	*ev = restEvent{}
	return json.Unmarshal(line, ev)
}

// lineReader reads the lines of a watch response. It tells whether a further line is already
// buffered, so that the lines that one read of the connection brought count as one message.
type lineReader struct {
	r    *bufio.Reader
	long []byte
}

func newLineReader(body io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(body, 64<<10)}
}

// next returns the next line (valid until the following call), blocking for it.
func (l *lineReader) next() ([]byte, error) {
	line, err := l.r.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, err
	}
	l.long = append(l.long[:0], line...)
	for err == bufio.ErrBufferFull {
		line, err = l.r.ReadSlice('\n')
		l.long = append(l.long, line...)
	}
	return l.long, err
}

// buffered is whether a whole line is in the buffer already (next will not block).
func (l *lineReader) buffered() bool {
	n := l.r.Buffered()
	if n == 0 {
		return false
	}
	b, _ := l.r.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

func (t *restTarget) watch(ctx context.Context, _ *grpc.ClientConn, w *watcher, ready func()) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.watchURL(w.resource), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := t.httpClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := ioutil.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("watch answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	lines := newLineReader(resp.Body)
	inPlace := false
	var ev restEvent
	for {
		line, err := lines.next()
		if err != nil {
			if err == io.EOF {
				return fmt.Errorf("the server ended the watch")
			}
			return err
		}
		now := monoNanos()
		w.beginMessage()
		for {
			if err := t.event(line, &ev, w, &inPlace, ready, now); err != nil {
				w.endMessage()
				return err
			}
			if !lines.buffered() {
				break
			}
			if line, err = lines.next(); err != nil {
				w.endMessage()
				return err
			}
		}
		w.endMessage()
	}
}

// event handles one line. Called between w.beginMessage and w.endMessage.
func (t *restTarget) event(line []byte, ev *restEvent, w *watcher, inPlace *bool, ready func(), now int64) error {
	if len(bytes.TrimSpace(line)) == 0 {
		return nil
	}
	if err := decodeRestEvent(line, ev); err != nil {
		w.unexpected(fmt.Sprintf("undecodable line: %v", err))
		return nil
	}
	switch ev.Type {
	case "BOOKMARK":
		if !*inPlace && ev.Object.Metadata.Annotations.InitialEventsEnd == "true" {
			*inPlace = true
			ready()
		} else {
			w.bookmark()
		}
		return nil
	case "ADDED", "MODIFIED":
	case "ERROR":
		return fmt.Errorf("ERROR event: %s", ev.Object.Message)
	default:
		w.unexpected("event type " + ev.Type)
		return nil
	}
	if !*inPlace {
		w.initialEvent()
		return nil
	}
	o := &ev.Object
	seq, err1 := strconv.ParseInt(o.Spec.Seq, 10, 64)
	sent, err2 := strconv.ParseInt(o.Spec.Sent, 10, 64)
	rev, err3 := strconv.ParseInt(o.Metadata.ResourceVersion, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		w.unexpected(fmt.Sprintf("object without seq, sent or resourceVersion: %q %q %q",
			o.Spec.Seq, o.Spec.Sent, o.Metadata.ResourceVersion))
		return nil
	}
	w.observe(seq, sent, rev, now)
	return nil
}

// probe checks both of the target's endpoints: the Store service (the writes) and the view.
func (t *restTarget) probe(ctx context.Context, conn *grpc.ClientConn) error {
	if err := t.cacheTarget.probe(ctx, conn); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.base+"/version", nil)
	if err != nil {
		return err
	}
	resp, err := t.httpClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(ioutil.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/version: %s", t.base, resp.Status)
	}
	return nil
}

// watchConns is how many gRPC connections the watchers use: none, they use HTTP.
func (t *restTarget) watchConns(int) int { return 0 }
