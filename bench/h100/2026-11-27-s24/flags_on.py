# pytest plugin / import hook: broadcast column scans on, the scan size limit lifted (session 24 experiment)
import framefuse.compiler.lower as _lower
import framefuse.compiler.simplify as _simplify

_simplify.SCAN_COLUMNS_BROADCAST = True
_lower.SCAN_MAX_ELEMENTS = 1 << 30
