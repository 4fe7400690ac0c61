package monitoring

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// legendVar is a Grafana legend placeholder, {{label}}.
var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend fills a panel target's legend format with a series' labels.
func legend(format string, l labels.Labels) string {
	if format == "" {
		return l.String()
	}
	return legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return l.Get(legendVar.FindStringSubmatch(m)[1])
	})
}

// Render draws every panel's queries over the recording, as the dashboard
// lays them out in reading order, three to a row, into a PNG at path.
// Times are seconds since the recording's start; the title says when
// events happened (marks).
func Render(r *Recorder, panels []Panel, title, path string) error {
	const cols = 3
	rows := (len(panels) + cols - 1) / cols
	const w, h = 6 * vg.Inch, 3.6 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(cols*w, vg.Length(rows)*h+0.5*vg.Inch), vgimg.UseDPI(96))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	top := draw.Crop(dc, 0, 0, vg.Length(rows)*h, 0)
	top.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 14), Handler: plot.DefaultTextHandler,
		XAlign: draw.XLeft, YAlign: draw.YTop}, vg.Point{X: 0.2 * vg.Inch, Y: top.Max.Y - 0.1*vg.Inch}, title)
	grid := draw.Crop(dc, 0, 0, 0, -0.5*vg.Inch)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 2,
		PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: vg.Millimeter}
	for i, p := range panels {
		pl, err := panelPlot(r, p)
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
		pl.Draw(tiles.At(grid, i%cols, i/cols))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// step is the resolution of the rendered series.
const step = time.Second

func panelPlot(r *Recorder, p Panel) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = "seconds"
	scale, unit := 1.0, p.Unit
	switch unit {
	case "bytes":
		scale, unit = 1<<20, "MiB"
	case "Bps":
		scale, unit = 1<<20, "MiB/s"
	case "short":
		unit = ""
	}
	pl.Y.Label.Text = unit
	pl.Legend.Top = true
	pl.Legend.TextStyle.Font.Size = vg.Points(7)
	pl.Add(plotter.NewGrid())
	type line struct {
		name string
		pts  plotter.XYs
		peak float64
	}
	var lines []line
	for _, q := range p.Queries {
		m, err := r.Range(q.Expr, step)
		if err != nil {
			return nil, err
		}
		for _, s := range m {
			l := line{name: legend(q.Legend, s.Metric)}
			for _, f := range s.Floats {
				if math.IsNaN(f.F) || math.IsInf(f.F, 0) {
					continue
				}
				l.pts = append(l.pts, plotter.XY{X: float64(f.T-r.First.UnixMilli()) / 1000, Y: f.F / scale})
				l.peak = max(l.peak, math.Abs(f.F))
			}
			if len(l.pts) > 0 {
				lines = append(lines, l)
			}
		}
	}
	// The busiest series first (most of a verdict panel's are zero), at
	// most eight.
	slices.SortStableFunc(lines, func(a, b line) int {
		if a.peak != b.peak {
			return cmp.Compare(b.peak, a.peak)
		}
		return strings.Compare(a.name, b.name)
	})
	for i, l := range lines[:min(len(lines), 8)] {
		pl2, err := plotter.NewLine(l.pts)
		if err != nil {
			return nil, err
		}
		pl2.Color = plotutil.Color(i)
		pl2.Width = vg.Points(1.5)
		pl.Add(pl2)
		pl.Legend.Add(l.name, pl2)
	}
	if len(lines) == 0 {
		pl.Title.Text += " (no data in this run)"
	}
	return pl, nil
}
