"""What a rewrite did: every match, every declined candidate with its reason, and how many
per-timestep ops are still left in the graph (the number that must reach 0 for a model to run
as one fused kernel per recurrence)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from framefuse.files import write_text_atomic
from framefuse.rewrite.base import Declined, Match


@dataclass
class RewriteReport:
    source: str = ""
    passes: list[str] = field(default_factory=list)
    matches: list[Match] = field(default_factory=list)
    declined: list[Declined] = field(default_factory=list)
    # op name (ONNX LSTM/GRU/RNN/Loop/Scan, or what the unrolled passes count) -> nodes left
    remaining_per_timestep_ops: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0

    @property
    def remaining_total(self) -> int:
        return sum(self.remaining_per_timestep_ops.values())

    def fused_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.matches:
            counts[m.op_type] = counts.get(m.op_type, 0) + 1
        return counts

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "passes": list(self.passes),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "fused_ops": self.fused_ops(),
            "matches": [dict(asdict(m), removed_count=len(m.removed)) for m in self.matches],
            "declined": [asdict(d) for d in self.declined],
            "remaining_per_timestep_ops": dict(self.remaining_per_timestep_ops),
            "remaining_per_timestep_ops_total": self.remaining_total,
            "notes": list(self.notes),
        }

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n")
        return path

    def print(self, console=None) -> None:
        """Print the report as rich tables."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=f"rewrite: {self.source or 'model'}")
        for col in ("pass", "new node", "op", "removed"):
            table.add_column(col)
        for m in self.matches:
            table.add_row(m.pass_name, m.node_name, m.op_type, f"{len(m.removed)} nodes")
        if not self.matches:
            table.add_row("-", "-", "(nothing fused)", "-")
        console.print(table)
        if self.declined:
            dtable = Table(title="declined candidates")
            for col in ("pass", "where", "reason"):
                dtable.add_column(col)
            for d in self.declined:
                dtable.add_row(d.pass_name, d.where, d.reason)
            console.print(dtable)
        remaining = ", ".join(f"{k}={v}" for k, v in self.remaining_per_timestep_ops.items() if v) or "none"
        console.print(f"nodes {self.nodes_before} -> {self.nodes_after}; per-timestep ops left: {remaining}")
        for note in self.notes:
            console.print(f"note: {note}")


def _json_default(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(obj)
