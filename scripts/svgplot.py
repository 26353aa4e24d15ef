"""Benchmark pictures as standalone SVG, with no plotting library: `bench_usemem.py --plot`.

One picture per matrix run, two panels:
1. throughput per configuration, a bar at the median and a dot per run; sequential
   configurations in MB/s and random ones in writes/s, each on its own scale (a random
   write moves 8 bytes, so MB/s says nothing about it);
2. fault latency per configuration: the medians over the runs of p50, p90, p99, p99.9
   and max, on one logarithmic axis in µs, joined by a line, so that the shape of each
   distribution (tight, or a long tail) shows at a glance.

`results` is an ordered list of `(name, [usemem JSON result, ...])`.
"""
import html
import math
import statistics

ROW = 22
LABEL_W = 190
PLOT_W = 520
MARGIN = 20
PCTS = [("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("p99.9_us", "p99.9"), ("max_us", "max")]
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


def _text(x, y, s, anchor="start", size=12, weight="normal"):
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" text-anchor="{anchor}">{html.escape(str(s))}</text>'


def _nice_max(v):
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= v:
            return m * p
    return 10 * p


def _fmt(v):
    return f"{v / 1000:g}k" if v >= 10000 else f"{v:.0f}"


def _bars(out, y, title, unit, rows):
    """rows: (name, [values]) with at least one value each. Returns the next y."""
    out.append(_text(MARGIN, y + 14, f"{title} ({unit}, bar: median, dots: runs)", size=13, weight="bold"))
    y += 24
    top = _nice_max(max(max(vs) for _, vs in rows))
    x0 = MARGIN + LABEL_W
    for i in range(5):
        gx = x0 + PLOT_W * i / 4
        out.append(f'<line x1="{gx:.1f}" y1="{y}" x2="{gx:.1f}" y2="{y + ROW * len(rows)}" stroke="#ddd"/>')
        out.append(_text(gx, y + ROW * len(rows) + 14, _fmt(top * i / 4), anchor="middle", size=10))
    for i, (name, vs) in enumerate(rows):
        ry = y + i * ROW
        m = statistics.median(vs)
        out.append(_text(x0 - 6, ry + 15, name, anchor="end", size=11))
        out.append(f'<rect x="{x0}" y="{ry + 4}" width="{PLOT_W * m / top:.1f}" height="{ROW - 8}" fill="#9ecae1"/>')
        out.append(_text(x0 + PLOT_W * m / top + 4, ry + 15, _fmt(m), size=10))
        for v in vs:
            out.append(f'<circle cx="{x0 + PLOT_W * v / top:.1f}" cy="{ry + ROW / 2}" r="2.5" fill="#08519c"/>')
    return y + ROW * len(rows) + 30


def _latency(out, y, rows):
    """rows: (name, {pct_key: median µs})."""
    out.append(_text(MARGIN, y + 14, "fault latency (µs, log scale; medians over the runs)", size=13, weight="bold"))
    y += 24
    values = [v for _, d in rows for v in d.values() if v > 0]
    lo = 10 ** math.floor(math.log10(min(values)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    decades = max(1, round(math.log10(hi / lo)))
    x0 = MARGIN + LABEL_W

    def xof(v):
        return x0 + PLOT_W * math.log10(max(v, lo) / lo) / decades

    for d in range(decades + 1):
        gx = x0 + PLOT_W * d / decades
        out.append(f'<line x1="{gx:.1f}" y1="{y}" x2="{gx:.1f}" y2="{y + ROW * len(rows)}" stroke="#ddd"/>')
        out.append(_text(gx, y + ROW * len(rows) + 14, _fmt(lo * 10**d), anchor="middle", size=10))
    for i, (name, d) in enumerate(rows):
        cy = y + i * ROW + ROW / 2
        out.append(_text(x0 - 6, cy + 4, name, anchor="end", size=11))
        pts = [(xof(d[k]), c) for (k, _), c in zip(PCTS, COLOURS) if d.get(k, 0) > 0]
        if len(pts) > 1:
            out.append(f'<line x1="{pts[0][0]:.1f}" y1="{cy}" x2="{pts[-1][0]:.1f}" y2="{cy}" stroke="#999"/>')
        for px, c in pts:
            out.append(f'<circle cx="{px:.1f}" cy="{cy}" r="4" fill="{c}"/>')
    ly = y + ROW * len(rows) + 30
    for j, ((_, label), c) in enumerate(zip(PCTS, COLOURS)):
        lx = x0 + j * 80
        out.append(f'<circle cx="{lx}" cy="{ly - 4}" r="4" fill="{c}"/>')
        out.append(_text(lx + 8, ly, label, size=11))
    return ly + 20


def render(results, title):
    """The SVG text for `results` (see the module's doc)."""
    seq, rand, lat = [], [], []
    for name, rs in results:
        if not rs:
            continue
        wps = [r["writes_per_s"] for r in rs if "writes_per_s" in r]
        if wps:
            rand.append((name, wps))
        else:
            seq.append((name, [r["throughput_mb_s"] for r in rs]))
        per_run = [r["stats"]["fault_latency"].get("all") for r in rs]
        per_run = [p for p in per_run if p]
        if per_run:
            lat.append((name, {k: statistics.median(p[k] for p in per_run) for k, _ in PCTS}))
    out = [_text(MARGIN, 24, title, size=15, weight="bold")]
    y = 40
    if seq:
        y = _bars(out, y, "sequential", "MB/s", seq)
    if rand:
        y = _bars(out, y, "random", "writes/s", rand)
    if lat:
        y = _latency(out, y, lat)
    width = MARGIN * 2 + LABEL_W + PLOT_W + 50
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" viewBox="0 0 {width} {y}" '
        'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
        f'<rect width="{width}" height="{y}" fill="white"/>'
    )
    return head + "".join(out) + "</svg>\n"
