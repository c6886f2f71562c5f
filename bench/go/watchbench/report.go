package main

import (
	"encoding/json"
	"fmt"
	"io"
	"io/ioutil"
	"os"
	"strings"
)

type metric struct {
	Key    string  `json:"key"`
	Label  string  `json:"label"`
	Value  float64 `json:"value"`
	Format string  `json:"format"`
}

type note struct {
	Key  string `json:"key"`
	Text string `json:"text"`
}

// result is one run's figures, printed as a Markdown table and kept as JSON for --summarize.
type result struct {
	Target  string   `json:"target"`
	Command string   `json:"command"`
	Label   string   `json:"label,omitempty"`
	Run     string   `json:"run"`
	Metrics []metric `json:"metrics"`
	Notes   []note   `json:"notes"`
}

func (r *result) add(key, label string, v float64, format string) {
	r.Metrics = append(r.Metrics, metric{key, label, v, format})
}

func (r *result) note(key, text string) { r.Notes = append(r.Notes, note{key, text}) }

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "\n| %s | %s |\n|---|---:|\n", r.Target, "value")
	for _, m := range r.Metrics {
		fmt.Fprintf(w, "| %s | %s |\n", m.Label, fmt.Sprintf(m.Format, m.Value))
	}
	fmt.Fprintln(w)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- %s: %s\n", n.Key, n.Text)
	}
}

// summarize prints one table for the runs in files: per metric, each target's mean over its
// runs (with every run's value when there are several), and the ratio of each cache_server
// column to etcd. The columns are cache_server, its Kubernetes view (rest) when there are runs
// of it, and etcd.
func summarize(files []string) int {
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "watchbench --summarize: name the --json files of the runs")
		return 2
	}
	byTarget := map[string][]*result{}
	var order []metric
	seen := map[string]bool{}
	for _, f := range files {
		data, err := ioutil.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "watchbench --summarize:", err)
			return 1
		}
		r := &result{}
		if err := json.Unmarshal(data, r); err != nil {
			fmt.Fprintf(os.Stderr, "watchbench --summarize: %s: %v\n", f, err)
			return 1
		}
		byTarget[r.Target] = append(byTarget[r.Target], r)
		for _, m := range r.Metrics {
			if !seen[m.Key] {
				seen[m.Key] = true
				order = append(order, m)
			}
		}
	}
	targets := []string{"cache_server", "etcd"}
	if len(byTarget["cache_server_rest"]) > 0 {
		targets = []string{"cache_server", "cache_server_rest", "etcd"}
	}
	heading := map[string]string{"cache_server": "cache_server", "cache_server_rest": "cache_server REST", "etcd": "etcd"}
	base := len(targets) - 1 // etcd, the denominator of the ratios
	value := func(r *result, key string) (float64, bool) {
		for _, m := range r.Metrics {
			if m.Key == key {
				return m.Value, true
			}
		}
		return 0, false
	}
	cell := func(t string, m metric) (string, float64, bool) {
		runs := byTarget[t]
		var sum float64
		var vals []string
		n := 0
		allIntegers := true
		for _, r := range runs {
			if v, ok := value(r, m.Key); ok {
				allIntegers = allIntegers && v == float64(int64(v))
				sum += v
				n++
				vals = append(vals, fmt.Sprintf(m.Format, v))
			} else {
				vals = append(vals, "-")
			}
		}
		if n == 0 {
			return "", 0, false
		}
		mean := sum / float64(n)
		text := fmt.Sprintf(m.Format, mean)
		if m.Format == "%.0f" && allIntegers && mean != float64(int64(mean)) && mean < 100 {
			text = fmt.Sprintf("%.1f", mean) // a count that differs between rounds: 0.5, not 0
		}
		if len(runs) > 1 {
			text += " (" + strings.Join(vals, " / ") + ")"
		}
		return text, mean, true
	}
	head, rule := "| figure |", "|---|"
	for _, t := range targets {
		head += " " + heading[t] + " |"
		rule += "---:|"
	}
	for _, t := range targets[:base] {
		head += " " + heading[t] + " / etcd |"
		rule += "---:|"
	}
	fmt.Printf("%s\n%s\n", head, rule)
	for _, m := range order {
		cells := make([]string, len(targets))
		means := make([]float64, len(targets))
		oks := make([]bool, len(targets))
		for i, t := range targets {
			cells[i], means[i], oks[i] = cell(t, m)
			if !oks[i] {
				cells[i] = "n/a"
			}
		}
		row := "| " + m.Label + " |"
		for _, c := range cells {
			row += " " + c + " |"
		}
		for i := range targets[:base] {
			ratio := ""
			if oks[i] && oks[base] && means[base] != 0 {
				ratio = fmt.Sprintf("%.2f", means[i]/means[base])
			}
			row += " " + ratio + " |"
		}
		fmt.Println(row)
	}
	var counts []string
	for _, t := range targets {
		counts = append(counts, fmt.Sprintf("%d %s", len(byTarget[t]), heading[t]))
	}
	last := len(counts) - 1
	fmt.Printf("\nValues are the mean of %s and %s run(s); each run's value in brackets.\n",
		strings.Join(counts[:last], ", "), counts[last])
	for _, t := range targets {
		for i, r := range byTarget[t] {
			for _, n := range r.Notes {
				if n.Key == "verified" || strings.HasPrefix(n.Key, "server threads by name") ||
					strings.Contains(n.Key, "error") || n.Key == "unexpected" {
					fmt.Printf("- %s run %d, %s: %s\n", t, i+1, n.Key, n.Text)
				}
			}
		}
	}
	return 0
}
