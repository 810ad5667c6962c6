"""Pictures of a lineage graph for people without Marquez: Graphviz text, SVG, HTML.

Pure functions of a `LineageGraph`. The SVG is laid out here (a small layered layout: layers
by longest path along the data flow, order within a layer by barycenter sweeps) so that no
Graphviz binary is needed; the DOT text is for those who have one.  Layers run left to
right and wrap, like lines of text, into bands stacked downwards: a long chain fits a
screen's width (a 6-step chain was 1,790 px in one row, its focus file cut off).
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

from roar_core.cli.wait import short_digest
from roar_core.lineage import ArtifactNode, Edge, LineageGraph, RunNode

_LABEL_MAX = 36  # characters per label line before it is shortened with an ellipsis
# Geometry of the SVG, in px. Text width is estimated (no font metrics without a renderer):
# 7 px per character suits 12 px sans-serif text, with some slack.
_CHAR_W = 7.0
_NODE_H = 42.0
_PAD_X = 14.0
_LAYER_GAP = 70.0
_ROW_GAP = 18.0
_MARGIN = 20.0
_MAX_WIDTH = 1180.0  # the picture within a 1,280 px window, with the page's margins
_BAND_GAP = 56.0  # between bands; the edges from one band to the next run along it
_SWEEPS = 4  # barycenter passes; more rarely changes the order of small graphs

_RUN_STYLE = {"fill": "#e8f0fe", "stroke": "#3367d6"}
_FAILED_RUN_STYLE = {"fill": "#fde8e8", "stroke": "#c5221f"}
_FILE_STYLE = {"fill": "#f1f8e9", "stroke": "#558b2f"}


def merge(graphs: list[LineageGraph]) -> LineageGraph:
    """One graph holding the nodes and edges of all (e.g. a file's upstream and downstream);
    key, direction and root are the first one's."""
    first = graphs[0]
    out = LineageGraph(first.key, first.direction, first.root)
    for g in graphs:
        out.artifacts.update(g.artifacts)
        out.runs.update(g.runs)
        out.edges |= g.edges
        out.root = out.root or g.root
    return out


def _shorten(text: str) -> str:
    return text if len(text) <= _LABEL_MAX else "…" + text[-(_LABEL_MAX - 1) :]


def short_names(uris: set[str]) -> dict[str, str]:
    """The shortest path suffix that tells each file apart from the others: the base name,
    plus parent directories only where two files share it (a copy to a new directory)."""
    parts = {u: [p for p in u.split("/") if p] or [u] for u in uris}
    out: dict[str, str] = {}
    for u, ps in parts.items():
        for k in range(1, len(ps) + 1):
            tail = ps[-k:]
            if all(q[-k:] != tail for v, q in parts.items() if v != u):
                break
        out[u] = "/".join(tail)
    return out


def _labels(node: ArtifactNode | RunNode, names: dict[str, str]) -> tuple[str, str]:
    if isinstance(node, RunNode):
        # The tail: run ids are UUIDv7, whose head is a timestamp shared by nearby runs.
        return _shorten(node.job_name), f"{node.status} …{node.run_id[-8:]}"
    return _shorten(names.get(node.uri, node.uri)), short_digest(node.digest)


def node_labels(g: LineageGraph) -> dict[str, tuple[str, str]]:
    """Two label lines per node id: job and status for runs, name and short digest for files."""
    names = short_names({a.uri for a in g.artifacts.values()})
    return {node_id: _labels(node, names) for node_id, node in _nodes(g).items()}


def _tooltip(node: ArtifactNode | RunNode) -> str:
    if isinstance(node, RunNode):
        return (f"run {node.run_id}\njob {node.job_name}\n{node.status}, "
                f"started {node.started_at.isoformat()}")
    return f"{node.uri}\n{node.digest or '(no digest)'}"


def _nodes(g: LineageGraph) -> dict[str, ArtifactNode | RunNode]:
    nodes: dict[str, ArtifactNode | RunNode] = {}
    nodes.update(g.artifacts)
    nodes.update(g.runs)
    return nodes


# An inferred edge (equal content under another path, the copying unobserved) is dashed.
_INFERRED_DOT = ' [style=dashed, label="inferred: equal content"]'


def _sorted_edges(g: LineageGraph) -> list[Edge]:
    return sorted(g.edges, key=lambda e: (e.source, e.target, e.kind))


# ---------------------------------------------------------------------------------------------
# DOT


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(g: LineageGraph) -> str:
    """Graphviz text: runs as boxes, files as ellipses labelled with a short digest."""
    lines = [
        "digraph lineage {",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [color="#666666"];',
    ]
    labels = node_labels(g)
    for node_id, node in sorted(_nodes(g).items()):
        line1, line2 = labels[node_id]
        if isinstance(node, RunNode):
            style = _FAILED_RUN_STYLE if node.status == "FAIL" else _RUN_STYLE
            shape = 'shape=box, style="rounded,filled"'
        else:
            style, shape = _FILE_STYLE, 'shape=ellipse, style="filled"'
        extra = ", penwidth=2.5" if node_id == g.root else ""
        lines.append(
            f"  {_dot_str(node_id)} [{shape}, fillcolor={_dot_str(style['fill'])}, "
            f"color={_dot_str(style['stroke'])}, label={_dot_str(line1 + chr(10) + line2)}, "
            f"tooltip={_dot_str(_tooltip(node))}{extra}];"
        )
    for e in _sorted_edges(g):
        style = _INFERRED_DOT if e.kind == "inferred" else ""
        lines.append(f"  {_dot_str(e.source)} -> {_dot_str(e.target)}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Layout


@dataclass(frozen=True)
class Box:
    x: float  # left
    y: float  # top
    w: float
    h: float

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    layers: list[list[str]]
    width: float
    height: float
    band: dict[str, int]  # node -> the band (row of layers) it is drawn in
    band_bottom: list[float]  # y below each band's nodes
    column: dict[str, tuple[float, float]]  # node -> left and right x of its layer


def _layers(ids: list[str], edges: list[Edge]) -> list[list[str]]:
    """Longest-path layering along the data flow. A cycle (a run that reads and writes one
    version of a file) cannot be layered: edges closing one are left out of the layering."""
    succ: dict[str, list[str]] = defaultdict(list)
    for e in edges:
        succ[e.source].append(e.target)
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: finished
    order: list[str] = []  # reverse post-order: a topological order of the acyclic part
    forward: dict[str, list[str]] = defaultdict(list)
    for start in ids:
        if start in state:
            continue
        stack = [(start, iter(succ[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                order.append(node)
                stack.pop()
            elif state.get(nxt) != 1:  # not a back edge
                forward[node].append(nxt)
                if nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ[nxt])))
    layer = dict.fromkeys(ids, 0)
    for node in reversed(order):
        for nxt in forward[node]:
            layer[nxt] = max(layer[nxt], layer[node] + 1)
    out: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for node in ids:
        out[layer[node]].append(node)
    return out


def _order(layers: list[list[str]], edges: list[Edge]) -> list[list[str]]:
    """Barycenter heuristic: sort each layer by the mean position of its neighbours in the
    layer before it, then sweep back the other way, to cut down edge crossings."""
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for e in edges:
        preds[e.target].append(e.source)
        succs[e.source].append(e.target)
    layers = [list(layer) for layer in layers]
    for sweep in range(_SWEEPS):
        down = sweep % 2 == 0
        indices = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
        for i in indices:
            ref = layers[i - 1] if down else layers[i + 1]
            pos = {n: k for k, n in enumerate(ref)}
            here = {n: float(k) for k, n in enumerate(layers[i])}
            neighbours = preds if down else succs
            layers[i] = sorted(layers[i], key=lambda n, p=pos, h=here, nb=neighbours: (
                _barycenter([p[m] for m in nb[n] if m in p], h[n])))
    return layers


def _barycenter(positions: list[int], default: float) -> float:
    # A node with no neighbour in the reference layer keeps its place.
    return sum(positions) / len(positions) if positions else default


def layout(g: LineageGraph, labels: dict[str, tuple[str, str]] | None = None) -> Layout:
    labels = labels or node_labels(g)
    # Start from a deterministic order (by label, then id), so equal graphs draw the same.
    ids = sorted(labels, key=lambda n: (labels[n], n))
    edges = _sorted_edges(g)
    layers = _order(_layers(ids, edges), edges)
    widths = {n: max(len(t) for t in labels[n]) * _CHAR_W + 2 * _PAD_X for n in ids}
    col_w = [max(widths[n] for n in layer) for layer in layers]
    bands: list[list[int]] = []
    used = 0.0
    for i, w in enumerate(col_w):
        # Room on the right for the lane of the edges down to the next band.
        if bands and used + _LAYER_GAP + w <= _MAX_WIDTH - 2 * _MARGIN - _LAYER_GAP / 2:
            bands[-1].append(i)
            used += _LAYER_GAP + w
        else:  # a new band; one layer wider than the limit still gets one of its own
            bands.append([i])
            used = w
    boxes: dict[str, Box] = {}
    band_of: dict[str, int] = {}
    column: dict[str, tuple[float, float]] = {}
    bottoms: list[float] = []
    width, top = 2 * _MARGIN, _MARGIN
    for b, band in enumerate(bands):
        tallest = max(len(layers[i]) for i in band)
        band_h = tallest * _NODE_H + (tallest - 1) * _ROW_GAP
        x = _MARGIN
        for i in band:
            h = len(layers[i]) * _NODE_H + (len(layers[i]) - 1) * _ROW_GAP
            y = top + (band_h - h) / 2  # centre short layers
            for n in layers[i]:
                boxes[n] = Box(x + (col_w[i] - widths[n]) / 2, y, widths[n], _NODE_H)
                band_of[n] = b
                column[n] = (x, x + col_w[i])
                y += _NODE_H + _ROW_GAP
            x += col_w[i] + _LAYER_GAP
        width = max(width, x - _LAYER_GAP / 2 + _MARGIN)
        bottoms.append(top + band_h)
        top += band_h + _BAND_GAP
    height = (top - _BAND_GAP + _MARGIN) if bands else 2 * _MARGIN
    return Layout(boxes, layers, width, height, band_of, bottoms, column)


def _edge_path(lay: Layout, source: str, target: str) -> str:
    """Within a band, a curve from the right of one box to the left of the next.  To a
    later band, only through empty space: right into the gap after the source's layer,
    down to the gap below its band, along it to the left of the target's layer, down, and
    into the target from the left (never across another box)."""
    a, b = lay.boxes[source], lay.boxes[target]
    if lay.band[target] <= lay.band[source]:
        x1, y1, x2, y2 = a.x + a.w, a.cy, b.x, b.cy
        mid = (x1 + x2) / 2
        return f"M {x1:.1f} {y1:.1f} C {mid:.1f} {y1:.1f} {mid:.1f} {y2:.1f} {x2:.1f} {y2:.1f}"
    out_x = lay.column[source][1] + _LAYER_GAP / 2
    in_x = lay.column[target][0] - _MARGIN / 2
    gap = lay.band_bottom[lay.band[source]] + _BAND_GAP / 2
    return (f"M {a.x + a.w:.1f} {a.cy:.1f} H {out_x:.1f} V {gap:.1f} H {in_x:.1f} "
            f"V {b.cy:.1f} H {b.x:.1f}")


# ---------------------------------------------------------------------------------------------
# SVG and HTML


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def to_svg(g: LineageGraph) -> str:
    """A standalone SVG document (no external fonts, scripts or images)."""
    nodes = _nodes(g)
    labels = node_labels(g)
    lay = layout(g, labels)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{lay.width:.0f}" '
        f'height="{lay.height:.0f}" viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{_attr('lineage of ' + g.key)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#666666"/></marker></defs>',
    ]
    for e in _sorted_edges(g):
        dash = ' stroke-dasharray="5 4"' if e.kind == "inferred" else ""
        out.append(
            f'<path class="edge {e.kind}" d="{_edge_path(lay, e.source, e.target)}" '
            'fill="none" stroke="#666666" stroke-linejoin="round" '
            f'stroke-width="1.2"{dash} marker-end="url(#arrow)">'
            + ("<title>inferred: equal content, the copy was not observed</title>"
               if dash else "") + "</path>"
        )
    for node_id in sorted(nodes):
        node, box = nodes[node_id], lay.boxes[node_id]
        line1, line2 = labels[node_id]
        stroke_w = 2.5 if node_id == g.root else 1.2
        if isinstance(node, RunNode):
            st = _FAILED_RUN_STYLE if node.status == "FAIL" else _RUN_STYLE
            shape = (f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" '
                     f'height="{box.h:.1f}" rx="5"')
            kind = "run"
        else:
            st = _FILE_STYLE
            shape = (f'<ellipse cx="{box.x + box.w / 2:.1f}" cy="{box.cy:.1f}" '
                     f'rx="{box.w / 2:.1f}" ry="{box.h / 2:.1f}"')
            kind = "file"
        cx = box.x + box.w / 2
        focus = " focus" if node_id == g.root else ""
        out.append(
            f'<g class="node {kind}{focus}" id="{_attr(node_id)}"><title>{_attr(_tooltip(node))}'
            f'</title>{shape} fill="{st["fill"]}" stroke="{st["stroke"]}" '
            f'stroke-width="{stroke_w}"/>'
            f'<text x="{cx:.1f}" y="{box.cy - 3:.1f}" text-anchor="middle">{_attr(line1)}</text>'
            f'<text x="{cx:.1f}" y="{box.cy + 12:.1f}" text-anchor="middle" font-size="10" '
            f'fill="#555555">{_attr(line2)}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 2em; }
code, td.mono { font-family: Menlo, Consolas, monospace; font-size: 0.9em; }
.graph { overflow: auto; border: 1px solid #ddd; padding: 0.5em; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 0.2em 0.8em; }
tr:nth-child(even) { background: #f6f6f6; } th { border-bottom: 1px solid #999; }
"""


def to_html(g: LineageGraph) -> str:
    """A self-contained page: the SVG picture and a table of every node."""
    run_rows = "".join(
        f"<tr><td>{_attr(r.job_name)}</td><td>{_attr(r.status)}</td>"
        f"<td>{_attr(r.started_at.isoformat())}</td><td class=\"mono\">{_attr(r.run_id)}</td>"
        "</tr>"
        for r in sorted(g.runs.values(), key=lambda r: (r.started_at, r.run_id))
    )
    file_rows = "".join(
        f"<tr><td class=\"mono\">{_attr(a.uri)}</td>"
        f"<td class=\"mono\">{_attr(a.digest or '(no digest)')}</td></tr>"
        for a in sorted(g.artifacts.values(), key=lambda a: (a.uri, a.digest or ""))
    )
    title = f"Lineage of {g.key}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{_attr(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>Lineage of <code>{_attr(g.key)}</code></h1>\n"
        f"<p>{len(g.runs)} runs, {len(g.artifacts)} files, {len(g.edges)} edges. "
        "Boxes are runs, ellipses are file versions (with a short blake3 digest); "
        "hover for details. Made by roar-core.</p>\n"
        f"<div class=\"graph\">\n{to_svg(g)}</div>\n"
        "<h2>Runs</h2>\n<table><tr><th>job</th><th>status</th><th>started</th>"
        f"<th>run id</th></tr>{run_rows}</table>\n"
        "<h2>Files</h2>\n<table><tr><th>path</th><th>digest</th></tr>"
        f"{file_rows}</table>\n</body>\n</html>\n"
    )


FORMATS = {"dot": to_dot, "svg": to_svg, "html": to_html}
