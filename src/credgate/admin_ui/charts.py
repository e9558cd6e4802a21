"""Bar charts as plain data for inline SVG: no script, no library, nothing fetched.

Each bar's label is centred under it, so the bars stand back from the chart's sides by half a label: the first
and the last label (today's) stay whole. Labels that would crowd their neighbours are left out, counted back
from the last; one too long for its room is shortened (the bar's tooltip keeps it whole)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 600, 160
LABEL_SIZE = 22  # the labels' font size in the chart's units (panel.css: .axis, .value)
CHAR_WIDTH = 0.62 * LABEL_SIZE  # a digit or a lowercase letter of a sans-serif font, with room to spare
SIDE = 36  # between the chart's sides and the bars: with half a bar, room for half a label of 5 characters
_GAP = 1.15  # labels stand this far apart, at least, in their own widths
_LONGEST = 12  # characters of a label, at most, before it is shortened (rather than labels left out for it)


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: int
    x: float
    y: float
    width: float
    height: float
    tick: str = ""  # the label as shown under the bar; empty where it is left out

    @property
    def middle(self) -> float:
        return round(self.x + self.width / 2, 1)


def _shortened(label: str, room: float) -> str:
    fits = max(1, int(room // CHAR_WIDTH))
    return label if len(label) <= fits else f"{label[: max(1, fits - 1)]}…"


def bars(points: Sequence[tuple[str, int]]) -> list[Bar]:
    """One bar per (label, value), scaled to the chart's box within its sides."""
    if not points:
        return []
    top = max(value for _, value in points) or 1
    slot = (WIDTH - 2 * SIDE) / len(points)
    widest = min(_LONGEST, max(len(label) for label, _ in points)) * CHAR_WIDTH
    every = max(1, math.ceil(widest * _GAP / slot))  # one label in `every`, the last one always
    room = min(every * slot / _GAP, 2 * SIDE + slot)  # between neighbours, and within the chart at its ends
    return [
        Bar(
            label=label,
            value=value,
            x=round(SIDE + index * slot + slot * 0.1, 1),
            y=round(HEIGHT - value / top * HEIGHT, 1),
            width=round(slot * 0.8, 1),
            height=round(value / top * HEIGHT, 1),
            tick=_shortened(label, room) if (len(points) - 1 - index) % every == 0 else "",
        )
        for index, (label, value) in enumerate(points)
    ]
