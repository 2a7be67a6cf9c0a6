"""MLSTMScan (domain `framefuse`, xLSTM mLSTM with stabilised exponential gating). See OPS.md.

Exports SCHEMA, reference (torch ground truth), launch (GPU kernel entry) and `mlstm_scan`.
Importing this package needs neither a GPU nor cuda-python.
"""

from framefuse.plugins.mlstm_scan.interface import launch, mlstm_scan
from framefuse.plugins.mlstm_scan.naive import reference
from framefuse.plugins.mlstm_scan.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "mlstm_scan"]
