"""Pure: a run's events drawn as a horizontal SVG time line, generated on the server.

Three lanes share one time axis (first event → last event): the run's lifecycle (start,
checkpoints, deliveries, resumes, the terminal event), the connection (drops shaded until
they end) and usage (one tick per model call). Every marker is a ``<g>`` with a
``data-kind`` (the event type) and a ``<title>`` tooltip; markers the decision in force
cites as evidence (``source/id``) get a halo.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from markupsafe import Markup, escape

from metering.catalogue import TERMINAL_TYPES
from metering.disputes.timeline import TimelineEvent

WIDTH, HEIGHT = 660, 190
X0, X1 = 88, 640
LANES = {"run": 44, "connection": 90, "usage": 134}
LANE_LABELS = {"run": "Run", "connection": "Connection", "usage": "Usage"}
AXIS_Y = 158
RECOVERY = ("connection.restored", "run.resumed", *TERMINAL_TYPES)


class Scale:
    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.span_s = (end - start).total_seconds()

    def x(self, moment: datetime) -> float:
        if self.span_s <= 0:
            return (X0 + X1) / 2
        return X0 + (moment - self.start).total_seconds() / self.span_s * (X1 - X0)


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S")


def describe(event: TimelineEvent) -> str:
    """The tooltip text for one event."""
    data = event.data
    head = f"{_clock(event.time)} UTC · attempt {event.attempt}"
    if event.type == "run.usage":
        tokens = (
            f"{int(data.get('input_tokens', 0)):,} in / "
            f"{int(data.get('cached_input_tokens', 0)):,} cached / "
            f"{int(data.get('output_tokens', 0)):,} out"
        )
        replay = " · replayed" if data.get("replay") else ""
        return f"Usage, step {data.get('step')} · {data.get('model')} · {tokens}{replay} · {head}"
    if event.type in ("connection.lost", "connection.restored"):
        verb = "Connection lost" if event.type == "connection.lost" else "Connection restored"
        reason = f" ({data['reason']})" if data.get("reason") else ""
        return f"{verb}, {event.side}-side{reason} · {head}"
    if event.type == "run.resumed":
        origin = (
            f" from checkpoint {data['from_checkpoint']}" if data.get("from_checkpoint") else ""
        )
        return f"Resumed as attempt {data.get('attempt')}{origin} · {_clock(event.time)} UTC"
    if event.type == "run.checkpoint":
        return f"Checkpoint {data.get('checkpoint_id')} after step {data.get('step')} · {head}"
    if event.type == "run.delivered":
        return f"Delivered ({data.get('kind')}) through step {data.get('step')} · {head}"
    if event.type == "run.tool_call":
        return f"Tool call {data.get('tool_call_id')} {data.get('status')} · {head}"
    if event.type == "run.failed":
        return f"Run failed, cause: {data.get('cause')} ({event.side}-side) · {head}"
    if event.type == "run.cancelled":
        return f"Run cancelled by {data.get('by')} · {head}"
    return f"{event.type.removeprefix('run.').capitalize()} · {head}"


def _label(text: str, x: float) -> str:
    """A caption above a marker, kept inside the plot near either edge."""
    anchor = "end" if x > X1 - 40 else ("start" if x < X0 + 40 else "middle")
    dx = {"end": 9, "start": -9, "middle": 0}[anchor]
    return f'<text class="m-label" x="{dx}" y="-14" text-anchor="{anchor}">{escape(text)}</text>'


def _shape(event: TimelineEvent, x: float) -> tuple[str, str]:
    """The marker's lane and its SVG shape (centred on x = 0, y = 0)."""
    kind, data = event.type, event.data
    if kind == "run.usage":
        cls = "m-usage replay" if data.get("replay") else "m-usage"
        return "usage", f'<line class="{cls}" x1="0" y1="-10" x2="0" y2="10"/>'
    if kind == "run.tool_call":
        cls = "m-tool failed" if data.get("status") == "failed" else "m-tool"
        return "usage", f'<circle class="{cls}" cx="0" cy="-15" r="3"/>'
    if kind == "connection.lost":
        return "connection", f'<path class="m-lost {event.side}" d="M-8,-8 L8,-8 L0,7 Z"/>'
    if kind == "connection.restored":
        return "connection", f'<path class="m-restored {event.side}" d="M-8,7 L8,7 L0,-8 Z"/>'
    if kind == "run.resumed":
        label = _label(f"resume #{data.get('attempt')}", x)
        return "run", f'<path class="m-resumed" d="M0,-9 L9,0 L0,9 L-9,0 Z"/>{label}'
    if kind == "run.checkpoint":
        return "run", '<path class="m-checkpoint" d="M-2,8 L-2,-9 L8,-5 L-2,-1"/>'
    if kind == "run.delivered":
        cls = "m-delivered final" if data.get("kind") == "final" else "m-delivered"
        return "run", f'<rect class="{cls}" x="-6" y="-6" width="12" height="12" rx="2"/>'
    if kind == "run.started":
        return "run", '<circle class="m-started" r="6"/>'
    if kind in TERMINAL_TYPES:
        word = {"run.completed": "completed", "run.failed": "failed", "run.cancelled": "cancelled"}
        label = _label(word[kind], x)
        return "run", f'<circle class="m-end {word[kind]}" r="8"/>{label}'
    return "run", '<circle class="m-other" r="2"/>'


def _marker(event: TimelineEvent, x: float, evidence: bool) -> str:
    lane, shape = _shape(event, x)
    halo = '<circle class="halo" r="13"/>' if evidence else ""
    side = f' data-side="{escape(event.side)}"' if event.side else ""
    return (
        f'<g class="mk{" evidence" if evidence else ""}" data-kind="{escape(event.type)}"'
        f'{side} data-event="{escape(event.source)}/{escape(event.id)}" '
        f'transform="translate({x:.1f},{LANES[lane]})">'
        f"<title>{escape(describe(event))}</title>{halo}{shape}</g>"
    )


def _interruptions(events: Sequence[TimelineEvent], scale: Scale) -> Iterable[str]:
    """A shaded bar from each connection drop to whatever ended it (or the last event)."""
    for i, lost in enumerate(events):
        if lost.type != "connection.lost":
            continue
        end = next(
            (
                e
                for e in events[i + 1 :]
                if e.type in RECOVERY and (e.type != "connection.restored" or e.side == lost.side)
            ),
            events[-1],
        )
        x0, x1 = scale.x(lost.time), scale.x(end.time)
        gap = duration((end.time - lost.time).total_seconds())
        ended = "open" if end is lost else f"until {end.type}"
        yield (
            f'<rect class="gap {escape(lost.side)}" data-kind="interruption" x="{x0:.1f}" '
            f'y="{LANES["connection"] - 5}" width="{max(x1 - x0, 2):.1f}" height="10">'
            f"<title>Interrupted ({escape(lost.side)}-side) for {gap}, {ended}</title></rect>"
        )


def _attempt_bands(events: Sequence[TimelineEvent], scale: Scale) -> Iterable[str]:
    starts = [(events[0].time, events[0].attempt)] + [
        (e.time, int(e.data.get("attempt", e.attempt))) for e in events if e.type == "run.resumed"
    ]
    for i, (start, attempt) in enumerate(starts):
        x0 = scale.x(start) if i else X0
        x1 = scale.x(starts[i + 1][0]) if i + 1 < len(starts) else X1
        yield (
            f'<rect class="band b{i % 2}" x="{x0:.1f}" y="18" width="{max(x1 - x0, 1):.1f}" '
            f'height="{AXIS_Y - 18}"/><text class="band-label" x="{x0 + 4:.1f}" y="{AXIS_Y - 5}">'
            f"attempt {attempt}</text>"
        )


def _axis(scale: Scale, start: datetime, end: datetime) -> Iterable[str]:
    yield f'<line class="axis" x1="{X0}" y1="{AXIS_Y}" x2="{X1}" y2="{AXIS_Y}"/>'
    for lane, y in LANES.items():
        yield f'<line class="lane" x1="{X0}" y1="{y}" x2="{X1}" y2="{y}"/>'
        yield f'<text class="lane-label" x="{X0 - 12}" y="{y + 4}">{LANE_LABELS[lane]}</text>'
    steps = 4 if scale.span_s > 0 else 0
    for i in range(steps + 1):
        moment = start + (end - start) * (i / steps) if steps else start
        x = scale.x(moment)
        yield f'<line class="axis" x1="{x:.1f}" y1="{AXIS_Y}" x2="{x:.1f}" y2="{AXIS_Y + 5}"/>'
        anchor = "start" if steps and i == 0 else ("end" if steps and i == steps else "middle")
        yield (
            f'<text class="tick" x="{x:.1f}" y="{AXIS_Y + 18}" text-anchor="{anchor}">'
            f"{_clock(moment)}</text>"
        )


def timeline_svg(events: Sequence[TimelineEvent], evidence_ids: Iterable[str] = ()) -> Markup:
    """The run's time line as inline SVG; an empty-state note when there are no events."""
    if not events:
        return Markup('<p class="empty">No events recorded for this run.</p>')
    ordered = sorted(events, key=lambda e: e.time)
    start, end = ordered[0].time, ordered[-1].time
    scale = Scale(start, end)
    evidence = set(evidence_ids)
    parts = [
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'data-span-s="{scale.span_s:.0f}" aria-label="Run time line, {duration(scale.span_s)}">',
        *_attempt_bands(ordered, scale),
        *_axis(scale, start, end),
        *_interruptions(ordered, scale),
        *(_marker(e, scale.x(e.time), f"{e.source}/{e.id}" in evidence) for e in ordered),
        "</svg>",
    ]
    # Every piece of event data above went through escape(); the rest is our own markup.
    return Markup("".join(parts))  # noqa: S704
