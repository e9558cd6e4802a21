"""Bar charts as plain data for inline SVG: no script, no library, nothing fetched."""

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 600, 160


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: int
    x: float
    y: float
    width: float
    height: float


def bars(points: Sequence[tuple[str, int]]) -> list[Bar]:
    """One bar per (label, value), scaled to the chart's box."""
    if not points:
        return []
    top = max(value for _, value in points) or 1
    slot = WIDTH / len(points)
    return [
        Bar(
            label=label,
            value=value,
            x=round(index * slot + slot * 0.1, 1),
            y=round(HEIGHT - value / top * HEIGHT, 1),
            width=round(slot * 0.8, 1),
            height=round(value / top * HEIGHT, 1),
        )
        for index, (label, value) in enumerate(points)
    ]
