"""Figures as pictures: test/bench.py's rows drawn as an SVG, by hand.

Each row is a measurement of one thing on several stores; the picture shows,
per row, how many times better kvd is than each other store (longer bar:
kvd better; a bar left of the 1x line: kvd worse), on a log scale, with
every raw figure printed beside it, so the picture alone can be checked
against the table it came from.  No library: the SVG is text written
here, the same rows give the same file (so a re-run shows in `git diff` as
changed numbers only).
"""
import math

COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd")  # one per other store
ROW_H, BAR_H, LEFT, WIDTH, RIGHT = 34, 11, 330, 900, 20


def _esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _num(v, unit):
    if v is None or v != v:
        return "-"
    if abs(v) >= 100:
        s = "{:,.0f}".format(v).replace(",", " ")
    elif abs(v) >= 10:
        s = "%.1f" % v
    else:
        s = "%.2f" % v
    return s + (" " + unit if unit else "")


def svg(title, subtitle, stores, rows, kvd="kvd"):
    """stores: names in order (kvd among them); rows: (label, {store: value},
    unit, higher_is_better).  Returns the SVG text."""
    others = [s for s in stores if s != kvd]
    lo, hi = 0.25, 64.0  # the x axis: kvd 4x worse .. 64x better
    span = math.log(hi / lo)
    plot_w = WIDTH - LEFT - RIGHT

    def x(r):
        r = min(max(r, lo), hi)
        return LEFT + plot_w * math.log(r / lo) / span

    top = 70
    height = top + ROW_H * len(rows) + 60
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
           'font-family="sans-serif" font-size="12">' % (WIDTH, height, WIDTH, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="22" font-size="16" font-weight="bold">%s</text>' % _esc(title),
           '<text x="10" y="40" fill="#555">%s</text>' % _esc(subtitle)]
    # legend
    lx = LEFT
    for i, s in enumerate(others):
        out.append('<rect x="%d" y="50" width="12" height="10" fill="%s"/>' % (lx, COLORS[i % len(COLORS)]))
        out.append('<text x="%d" y="59">%s / %s</text>' % (lx + 16, _esc(kvd), _esc(s)))
        lx += 30 + 8 * len(kvd + s) + 16
    # grid
    bottom = top + ROW_H * len(rows)
    r = lo
    while r <= hi * 1.0001:
        gx = x(r)
        strong = abs(r - 1) < 1e-9
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="%s"/>'
                   % (gx, top - 4, gx, bottom, "#000" if strong else "#ddd", "1.5" if strong else "1"))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%gx</text>' % (gx, bottom + 16, r))
        r *= 2
    out.append('<text x="%d" y="%d" fill="#555">kvd better to the right of 1x, worse to the left '
               '(log scale; clipped at %gx and %gx)</text>' % (LEFT, bottom + 34, lo, hi))
    for j, (label, vals, unit, higher) in enumerate(rows):
        y = top + ROW_H * j
        out.append('<text x="10" y="%d">%s</text>' % (y + 13, _esc(label)))
        raw = " \u00b7 ".join("%s %s" % (s, _num(vals.get(s), unit)) for s in stores)
        out.append('<text x="10" y="%d" font-size="10" fill="#777">%s</text>' % (y + 26, _esc(raw)))
        for i, s in enumerate(others):
            a, b = vals.get(kvd), vals.get(s)
            if not a or not b or a != a or b != b or a <= 0 or b <= 0:
                continue
            ratio = a / b if higher else b / a
            by = y + 3 + i * (BAR_H + 2) * 2 // max(len(others), 1)
            x0, x1 = sorted((x(1.0), x(ratio)))
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>'
                       % (x0, by, max(x1 - x0, 1), BAR_H, COLORS[i % len(COLORS)]))
            label = ("%.1fx" % ratio) if ratio >= 1 else ("%.2fx" % ratio)
            if ratio >= 1 and x1 + 4 + 7 * len(label) > WIDTH:  # no room right of the bar: inside it
                out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="end" fill="white">%s</text>'
                           % (x1 - 3, by + BAR_H - 1, label))
                continue
            tx = x1 + 4 if ratio >= 1 else x0 - 4
            out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="%s">%s</text>'
                       % (tx, by + BAR_H - 1, "start" if ratio >= 1 else "end", label))
    out.append('</svg>')
    return "\n".join(out) + "\n"
