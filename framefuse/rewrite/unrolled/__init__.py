"""Rewrite passes for recurrences unrolled over time by Python loops (issue 3).

A plain ``torch.onnx.export`` of a loop over a static T leaves T copies of the step subgraph
chained through the state. These passes find the loop-carried chain structurally
(``timeline``, ``chains``), prove what kind of recurrence it is, lift the state-independent
per-step inputs over all steps (``lift``) and replace the chain with one ``framefuse`` node.
A step that carries two coupled states (an LSTM cell's h and c) is no one-state chain: its pass
finds its own (``UnrolledPass.find``; ``lstm``: the cells' c updates linked step to step).

- ``PASSES``: the pass classes, in the order to run them (a rewrite makes its own instances).
- ``remaining_recurrence_ops(graph)``: per-step recurrent ops left unfused.
"""

from framefuse.rewrite.unrolled.chunked import ChunkedScanReportPass
from framefuse.rewrite.unrolled.common import remaining_recurrence_ops, restack
from framefuse.rewrite.unrolled.delta import DeltaRuleScanPass
from framefuse.rewrite.unrolled.gated_delta import GatedDeltaRuleScanPass
from framefuse.rewrite.unrolled.gru import GRUCellPass
from framefuse.rewrite.unrolled.linear import LinearScanPass
from framefuse.rewrite.unrolled.liquid import LiquidScanPass
from framefuse.rewrite.unrolled.lstm import LSTMCellPass
from framefuse.rewrite.unrolled.mlstm import MLSTMScanPass
from framefuse.rewrite.unrolled.selective import SelectiveScanPass
from framefuse.rewrite.unrolled.stacking import OutputStackingPass
from framefuse.rewrite.unrolled.wkv import WKVScanPass

# Non-linear recurrences first (each matches an exact structure), the general linear one last:
# it reports, for every chain still left, why it is not a linear recurrence.
# SelectiveScan before LinearScan: a Mamba recurrence is also linear, the more specific op wins.
# WKVScan first: its running max is a Max chain that MLSTMScan would otherwise try and decline.
# OutputStackingPass first: in-place writes out[:, t] = h are a stack, not a recurrence to try.
PASSES = (
    OutputStackingPass,
    WKVScanPass,
    LiquidScanPass,
    GRUCellPass,
    LSTMCellPass,
    GatedDeltaRuleScanPass,
    DeltaRuleScanPass,
    MLSTMScanPass,
    SelectiveScanPass,
    LinearScanPass,
    ChunkedScanReportPass,
)

__all__ = [
    "PASSES",
    "DeltaRuleScanPass",
    "GRUCellPass",
    "LinearScanPass",
    "LiquidScanPass",
    "LSTMCellPass",
    "MLSTMScanPass",
    "SelectiveScanPass",
    "remaining_recurrence_ops",
    "restack",
]
