package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	structpb "github.com/golang/protobuf/ptypes/struct"
	"go.etcd.io/etcd/etcdserver/etcdserverpb"
	"go.etcd.io/etcd/mvcc/mvccpb"
	"google.golang.org/grpc"

	// Generated at build time from proto/shardcache/v1/store.proto (bench/go_watch_bench.sh).
	storev1 "shardcache/gen/storev1"
)

// target is one server kind. Both kinds are driven by the same code in main.go: a watcher calls
// watch once and gets its events through w.observe; the writer calls write.
type target interface {
	name() string
	// watch opens one watch stream of resource w.resource on conn and reads it until ctx ends or
	// the stream fails. It calls ready once the watch is in place (cache_server: the bookmark
	// that ends the initial events; etcd: the created response).
	watch(ctx context.Context, conn *grpc.ClientConn, w *watcher, ready func()) error
	// write creates one object (cache_server: Create; etcd: Put) that carries seq and the send
	// time, and returns the store revision it was written at.
	write(ctx context.Context, conn *grpc.ClientConn, resource int, seq, sentNanos int64, value string) (int64, error)
	// probe makes one cheap read, to find out whether the server answers.
	probe(ctx context.Context, conn *grpc.ClientConn) error
}

const benchGroup = "bench.shardcache.io"

func resourceName(i int) string {
	if i == 0 {
		return "widgets"
	}
	return fmt.Sprintf("widgets%d", i)
}

func objectName(seq int64) string { return "w-" + strconv.FormatInt(seq, 10) }

// ---- cache_server ----

type cacheTarget struct {
	// cluster is the logical cluster of this run's objects, new in every run, so that a watch
	// (filtered on it) starts with no initial objects even on a server that kept earlier runs'.
	cluster string
	batch   bool
	// json asks for objects as JSON bytes (WatchRequest.json_objects); the watcher then reads
	// seq, sent and resourceVersion out of the JSON without decoding the rest, as it reads etcd's
	// value, whose prefix carries seq and sent.
	json bool
	// bookmarks asks for periodic bookmarks (WatchRequest.allow_bookmarks); etcd's counterpart is
	// progress_notify, which etcdTarget asks for with the same flag.
	bookmarks bool
}

func (t *cacheTarget) name() string { return "cache_server" }

func (t *cacheTarget) gvr(i int) *storev1.GroupVersionResource {
	return &storev1.GroupVersionResource{Group: benchGroup, Version: "v1", Resource: resourceName(i)}
}

const initialEventsEnd = "k8s.io/initial-events-end"

func (t *cacheTarget) watch(ctx context.Context, conn *grpc.ClientConn, w *watcher, ready func()) error {
	client := storev1.NewStoreClient(conn)
	stream, err := client.Watch(ctx, &storev1.WatchRequest{
		Resource:       t.gvr(w.resource),
		Cluster:        t.cluster,
		BatchEvents:    t.batch,
		JsonObjects:    t.json,
		AllowBookmarks: t.bookmarks,
	})
	if err != nil {
		return err
	}
	inPlace := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		now := monoNanos()
		events := msg.GetEvents()
		if len(events) == 0 {
			events = []*storev1.WatchEvent{msg}
		}
		w.beginMessage()
		for _, ev := range events {
			obj := ev.GetObject()
			switch ev.GetType() {
			case storev1.WatchEvent_BOOKMARK:
				initialEnd := obj.GetMetadata().GetAnnotations()[initialEventsEnd] == "true"
				if t.json {
					initialEnd = bytes.Contains(ev.GetObjectJson(), initialEventsEndJSON)
				}
				if !inPlace && initialEnd {
					inPlace = true
					ready()
				} else {
					w.bookmark()
				}
				continue
			case storev1.WatchEvent_ADDED, storev1.WatchEvent_MODIFIED:
			default:
				w.unexpected(fmt.Sprintf("event type %v", ev.GetType()))
				continue
			}
			if !inPlace {
				w.initialEvent()
				continue
			}
			var seqText, sentText, revText string
			if t.json {
				data := ev.GetObjectJson()
				seqText, sentText, revText = jsonString(data, "seq"), jsonString(data, "sent"), jsonString(data, "resourceVersion")
			} else {
				fields := obj.GetSpec().GetFields()
				seqText, sentText, revText = fields["seq"].GetStringValue(), fields["sent"].GetStringValue(), obj.GetMetadata().GetResourceVersion()
			}
			seq, err1 := strconv.ParseInt(seqText, 10, 64)
			sent, err2 := strconv.ParseInt(sentText, 10, 64)
			rev, err3 := strconv.ParseInt(revText, 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				w.unexpected(fmt.Sprintf("object without seq, sent or resourceVersion: %q %q %q", seqText, sentText, revText))
				continue
			}
			w.observe(seq, sent, rev, now)
		}
		w.endMessage()
	}
}

var initialEventsEndJSON = []byte(`"` + initialEventsEnd + `":"true"`)

// jsonString returns the value of the first string member named key in a JSON text that has no
// whitespace (as cache_server writes object_json), or "" when there is none. Enough for the
// digits of seq, sent and resourceVersion: an escaped quote inside another string is written
// \", so the search cannot match inside one.
func jsonString(data []byte, key string) string {
	needle := make([]byte, 0, len(key)+4)
	needle = append(append(append(needle, '"'), key...), `":"`...)
	i := bytes.Index(data, needle)
	if i < 0 {
		return ""
	}
	rest := data[i+len(needle):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return ""
	}
	return string(rest[:end])
}

func (t *cacheTarget) write(ctx context.Context, conn *grpc.ClientConn, resource int, seq, sentNanos int64, value string) (int64, error) {
	client := storev1.NewStoreClient(conn)
	obj, err := client.Create(ctx, &storev1.CreateRequest{
		Resource: t.gvr(resource),
		Object: &storev1.Object{
			Metadata: &storev1.ObjectMeta{Cluster: t.cluster, Namespace: "default", Name: objectName(seq)},
			Spec: &structpb.Struct{Fields: map[string]*structpb.Value{
				"seq":   {Kind: &structpb.Value_StringValue{StringValue: strconv.FormatInt(seq, 10)}},
				"sent":  {Kind: &structpb.Value_StringValue{StringValue: strconv.FormatInt(sentNanos, 10)}},
				"value": {Kind: &structpb.Value_StringValue{StringValue: value}},
			}},
		},
	})
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(obj.GetMetadata().GetResourceVersion(), 10, 64)
}

func (t *cacheTarget) probe(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := storev1.NewStoreClient(conn).List(ctx, &storev1.ListRequest{Resource: t.gvr(0), Limit: 1})
	return err
}

// ---- etcd ----

type etcdTarget struct {
	// run is part of every key, new in every run, as cacheTarget's cluster.
	run string
	// progressNotify asks for progress notifications (etcd's periodic bookmarks; etcd 3.4 sends
	// them every 10 minutes unless --experimental-watch-progress-notify-interval says otherwise).
	progressNotify bool
}

func (t *etcdTarget) name() string { return "etcd" }

// prefix is the key prefix of resource i: /registry/<group>/<resource>/<run>/ (one prefix per
// resource, as the Kubernetes API server lays out its keys).
func (t *etcdTarget) prefix(i int) string {
	return "/registry/" + benchGroup + "/" + resourceName(i) + "/" + t.run + "/"
}

// prefixEnd is the range end that makes a range (or watch) cover every key under prefix.
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

func (t *etcdTarget) watch(ctx context.Context, conn *grpc.ClientConn, w *watcher, ready func()) error {
	stream, err := etcdserverpb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		return err
	}
	p := t.prefix(w.resource)
	err = stream.Send(&etcdserverpb.WatchRequest{RequestUnion: &etcdserverpb.WatchRequest_CreateRequest{
		CreateRequest: &etcdserverpb.WatchCreateRequest{Key: []byte(p), RangeEnd: prefixEnd(p), ProgressNotify: t.progressNotify},
	}})
	if err != nil {
		return err
	}
	inPlace := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		now := monoNanos()
		if resp.Canceled {
			return fmt.Errorf("etcd canceled the watch (compact revision %d): %s", resp.CompactRevision, resp.CancelReason)
		}
		if resp.Created && !inPlace {
			inPlace = true
			ready()
		}
		if len(resp.Events) == 0 {
			if !resp.Created {
				w.bookmark() // a progress notification
			}
			continue
		}
		w.beginMessage()
		for _, ev := range resp.Events {
			if ev.Type != mvccpb.PUT || ev.Kv == nil {
				w.unexpected(fmt.Sprintf("event type %v", ev.Type))
				continue
			}
			seq, sent, ok := parseEtcdValue(ev.Kv.Value)
			if !ok {
				w.unexpected("value without seq and sent: " + string(ev.Kv.Key))
				continue
			}
			w.observe(seq, sent, ev.Kv.ModRevision, now)
		}
		w.endMessage()
	}
}

// An etcd value is "<seq> <sent nanos> <random ASCII>", --value-bytes long in all.
func etcdValue(seq, sentNanos int64, value string) []byte {
	head := strconv.FormatInt(seq, 10) + " " + strconv.FormatInt(sentNanos, 10) + " "
	if len(head) < len(value) {
		value = value[len(head):]
	} else {
		value = ""
	}
	return []byte(head + value)
}

func parseEtcdValue(v []byte) (int64, int64, bool) {
	s := string(v[:min(len(v), 64)])
	f := strings.SplitN(s, " ", 3)
	if len(f) < 3 {
		return 0, 0, false
	}
	seq, err1 := strconv.ParseInt(f[0], 10, 64)
	sent, err2 := strconv.ParseInt(f[1], 10, 64)
	return seq, sent, err1 == nil && err2 == nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func (t *etcdTarget) write(ctx context.Context, conn *grpc.ClientConn, resource int, seq, sentNanos int64, value string) (int64, error) {
	resp, err := etcdserverpb.NewKVClient(conn).Put(ctx, &etcdserverpb.PutRequest{
		Key:   []byte(t.prefix(resource) + objectName(seq)),
		Value: etcdValue(seq, sentNanos, value),
	})
	if err != nil {
		return 0, err
	}
	if resp.Header == nil {
		return 0, fmt.Errorf("put answered without a header")
	}
	return resp.Header.Revision, nil
}

func (t *etcdTarget) probe(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := etcdserverpb.NewKVClient(conn).Range(ctx, &etcdserverpb.RangeRequest{Key: []byte("/probe"), Limit: 1})
	return err
}

// keep the timing helpers in one place
var processStart = time.Now()

// monoNanos is the time since the program started, from the monotonic clock. Writer and
// watchers are in this process, so a send time and a receive time compare directly.
func monoNanos() int64 { return int64(time.Since(processStart)) }
