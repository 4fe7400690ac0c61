// Package monitoring checks deploy/monitoring (the Grafana dashboard and
// the PrometheusRule alerts) with Prometheus's own PromQL parser, engine
// and rule evaluation, against the metrics a real agent exports, and
// renders the dashboard's panels over a recorded run.
package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
	"sigs.k8s.io/yaml"
)

// Dir is deploy/monitoring, from this package's directory.
const Dir = "../../deploy/monitoring"

// RateInterval is Grafana's $__rate_interval for Prometheus's default
// scrape interval of 15 s (four of them).
const RateInterval = "1m"

// Panel is one dashboard panel with its queries, Grafana's variables
// replaced by what they select when "All" is chosen.
type Panel struct {
	Title   string
	Kind    string
	Unit    string
	Queries []Query
}

// Query is one target of a panel.
type Query struct {
	Expr   string
	Legend string
}

// LoadDashboard reads the dashboard JSON and its panels' queries, with
// rateInterval for Grafana's $__rate_interval (four scrape intervals).
func LoadDashboard(path, rateInterval string) ([]Panel, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Title  string
		Panels []struct {
			Title       string
			Type        string
			FieldConfig struct {
				Defaults struct{ Unit string }
			}
			Targets []struct {
				Expr         string
				LegendFormat string
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.Title == "" {
		return nil, fmt.Errorf("%s: no title", path)
	}
	var out []Panel
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		pan := Panel{Title: p.Title, Kind: p.Type, Unit: p.FieldConfig.Defaults.Unit}
		for _, t := range p.Targets {
			expr := strings.NewReplacer(`$instance`, `.*`, `$__rate_interval`, rateInterval).Replace(t.Expr)
			pan.Queries = append(pan.Queries, Query{Expr: expr, Legend: t.LegendFormat})
		}
		out = append(out, pan)
	}
	return out, nil
}

// Alert is one alerting rule of the PrometheusRule.
type Alert struct {
	Name        string
	Expr        string
	For         time.Duration
	Labels      map[string]string
	Annotations map[string]string
}

// LoadAlerts reads the PrometheusRule's groups and checks them as
// Prometheus would load them (rulefmt: names, durations, templates).
func LoadAlerts(path string) ([]Alert, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &cr, yaml.DisallowUnknownFields); err != nil {
		// The metadata is the API server's to check; only the spec is
		// Prometheus's.
		if err := yaml.Unmarshal(b, &cr); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s: %s %s, want a monitoring.coreos.com/v1 PrometheusRule", path, cr.APIVersion, cr.Kind)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": cr.Spec.Groups})
	if err != nil {
		return nil, err
	}
	rg, errs := rulefmt.Parse(groups, false, model.UTF8Validation, Parser, slog.Default())
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %v", path, errs)
	}
	var out []Alert
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			out = append(out, Alert{Name: r.Alert, Expr: r.Expr, For: time.Duration(r.For), Labels: r.Labels, Annotations: r.Annotations})
		}
	}
	return out, nil
}

// Parser is PromQL's parser with Prometheus's default options.
var Parser = parser.NewParser(parser.Options{})

// MetricNames lists the metric names an expression selects.
func MetricNames(expr string) ([]string, error) {
	e, err := Parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
						name = m.Value
					}
				}
			}
			if name != "" && !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
		return nil
	})
	return names, nil
}

// Known answers whether name is a series name the exposition families
// produce: a family's own name, or a histogram's or summary's _bucket,
// _sum and _count series.
func Known(families map[string]model.MetricType, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch families[base] {
		case model.MetricTypeHistogram, model.MetricTypeSummary:
			return suffix != "_bucket" || families[base] == model.MetricTypeHistogram
		}
	}
	return false
}

// Recorder keeps scrapes of /metrics in a Prometheus TSDB, as Prometheus
// would have stored them (the target's job and instance labels added, and
// up), for PromQL queries and rule evaluation.
type Recorder struct {
	Storage storage.Storage
	Engine  *promql.Engine
	Job     string
	// Instance labels the target.
	Instance string
	// Families are the exposition's metric families seen so far, with
	// their types.
	Families map[string]model.MetricType
	// First and Last are the first and the last scrape's times.
	First, Last time.Time
}

// NewRecorder records into s.
func NewRecorder(s storage.Storage, job, instance string) *Recorder {
	return &Recorder{
		Storage: s, Job: job, Instance: instance, Families: map[string]model.MetricType{},
		Engine: promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute}),
	}
}

// Add stores one scrape (the text exposition format) taken at ts, and up
// 1; a failed scrape (text nil) stores up 0 only.
func (r *Recorder) Add(text []byte, ts time.Time) error {
	app := r.Storage.Appender(context.Background())
	t := ts.UnixMilli()
	add := func(name string, lbls map[string]string, v float64) error {
		b := labels.NewScratchBuilder(len(lbls) + 3)
		b.Add(labels.MetricName, name)
		b.Add("job", r.Job)
		b.Add("instance", r.Instance)
		for k, val := range lbls {
			b.Add(k, val)
		}
		b.Sort()
		_, err := app.Append(0, b.Labels(), t, v)
		return err
	}
	up := 0.0
	if text != nil {
		up = 1
		fams, err := parseText(text)
		if err != nil {
			_ = app.Rollback()
			return fmt.Errorf("scrape at %s: %w", ts.Format(time.RFC3339), err)
		}
		for name, f := range fams {
			r.Families[name] = model.MetricType(strings.ToLower(f.GetType().String()))
			for _, m := range f.GetMetric() {
				lbls := map[string]string{}
				for _, lp := range m.GetLabel() {
					lbls[lp.GetName()] = lp.GetValue()
				}
				var err error
				switch {
				case m.Counter != nil:
					err = add(name, lbls, m.Counter.GetValue())
				case m.Gauge != nil:
					err = add(name, lbls, m.Gauge.GetValue())
				case m.Untyped != nil:
					err = add(name, lbls, m.Untyped.GetValue())
				case m.Histogram != nil:
					err = addHistogram(add, name, lbls, m.Histogram.GetBucket(), m.Histogram.GetSampleSum(), m.Histogram.GetSampleCount())
				case m.Summary != nil:
					if err = add(name+"_sum", lbls, m.Summary.GetSampleSum()); err == nil {
						err = add(name+"_count", lbls, float64(m.Summary.GetSampleCount()))
					}
				}
				if err != nil {
					_ = app.Rollback()
					return fmt.Errorf("%s%v: %w", name, lbls, err)
				}
			}
		}
	}
	if err := add("up", nil, up); err != nil {
		_ = app.Rollback()
		return err
	}
	if r.First.IsZero() {
		r.First = ts
	}
	r.Last = ts
	return app.Commit()
}

// families notes the metric families of an exposition, without storing
// it.
func (r *Recorder) families(text []byte) error {
	fams, err := parseText(text)
	if err != nil {
		return err
	}
	for name, f := range fams {
		r.Families[name] = model.MetricType(strings.ToLower(f.GetType().String()))
	}
	return nil
}

func parseText(text []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(text))
}

type histogramBucket interface {
	GetUpperBound() float64
	GetCumulativeCount() uint64
}

func addHistogram[B histogramBucket](add func(string, map[string]string, float64) error, name string, lbls map[string]string, buckets []B, sum float64, count uint64) error {
	for _, b := range buckets {
		bl := maps.Clone(lbls)
		bl["le"] = model.FloatString(b.GetUpperBound()).String()
		if err := add(name+"_bucket", bl, float64(b.GetCumulativeCount())); err != nil {
			return err
		}
	}
	inf := maps.Clone(lbls)
	inf["le"] = "+Inf"
	if err := add(name+"_bucket", inf, float64(count)); err != nil {
		return err
	}
	if err := add(name+"_sum", lbls, sum); err != nil {
		return err
	}
	return add(name+"_count", lbls, float64(count))
}

// Instant evaluates expr at ts.
func (r *Recorder) Instant(expr string, ts time.Time) (promql.Vector, error) {
	return rules.EngineQueryFunc(r.Engine, r.Storage)(context.Background(), expr, ts)
}

// Range evaluates expr over the recording, a point every step.
func (r *Recorder) Range(expr string, step time.Duration) (promql.Matrix, error) {
	q, err := r.Engine.NewRangeQuery(context.Background(), r.Storage, nil, expr, r.First, r.Last, step)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	return res.Matrix()
}

// Rules are the alerts as Prometheus's rule engine evaluates them.
type Rules struct {
	alerts []Alert
	rules  []*rules.AlertingRule
}

// NewRules builds the alerting rules.
func NewRules(alerts []Alert) (*Rules, error) {
	out := &Rules{alerts: alerts}
	for _, a := range alerts {
		e, err := Parser.ParseExpr(a.Expr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.Name, err)
		}
		out.rules = append(out.rules, rules.NewAlertingRule(a.Name, e, a.For, 0,
			labels.FromMap(a.Labels), labels.FromMap(a.Annotations), labels.EmptyLabels(), "", false, slog.New(slog.DiscardHandler)))
	}
	return out, nil
}

// Eval evaluates every rule at ts (as one evaluation of their group) and
// returns the firing alerts' names.
func (rs *Rules) Eval(r *Recorder, ts time.Time) ([]string, error) {
	query := rules.EngineQueryFunc(r.Engine, r.Storage)
	var firing []string
	for i, rule := range rs.rules {
		if _, err := rule.Eval(context.Background(), 0, ts, query, nil, 0); err != nil {
			return nil, fmt.Errorf("%s: %w", rs.alerts[i].Name, err)
		}
		for _, a := range rule.ActiveAlerts() {
			if a.State == rules.StateFiring {
				firing = append(firing, rule.Name())
				break
			}
		}
	}
	return firing, nil
}

// Paths of the manifests.
var (
	DashboardPath = filepath.Join(Dir, "xvs-dashboard.json")
	RulesPath     = filepath.Join(Dir, "prometheusrule.yaml")
)

// Active lists the rules with an alert pending or firing, as of their
// last evaluation.
func (rs *Rules) Active() []string {
	var out []string
	for _, rule := range rs.rules {
		if len(rule.ActiveAlerts()) > 0 {
			out = append(out, rule.Name())
		}
	}
	return out
}
