"""The real-models suite needs transformers (a dev dependency): without it, skip cleanly."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="tests/real_models needs transformers (pip install -e .[dev])")


@pytest.fixture(scope="session")
def export_root(tmp_path_factory):
    return tmp_path_factory.mktemp("real_models")
